"""Needle 3 geometry (an archive's `V3Config`), read from the `.cact` header (fixture README
"The `.cact` archive").

The header is 48 little-endian u32 followed by one f32 rope_theta (196 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import geometry_common as common

FORMAT_TAG = 0x05E12A84
HEADER_U32 = 48
HEADER_BYTES = HEADER_U32 * 4 + 4
# Hadamard-MLP conditioning rank: `cond_v` is [d, 8] in every archive (README record list).
COND_RANK = 8


@dataclass(frozen=True)
class V3Config(common.CactGeometry):
    """Frozen Needle 3 geometry. Field names follow the fixture README's header table."""

    out_vocab: int
    qk_head_dim: int
    v_head_dim: int
    sliding_window: int
    global_layers: tuple[int, ...]
    qkv_conv_taps: int
    engram_seed_heads: int
    generation: int = 3

    @property
    def logits_vocab(self) -> int:
        """Rows of the tied embedding that are logits (`out_vocab` 0 = all of them)."""
        return self.out_vocab if self.out_vocab else self.vocab

    @property
    def hada_blocks(self) -> tuple[int, int]:
        """Monarch factor sizes (ba, bb): ba = 2^(bitlen(N-1)//2), bb = N/ba (README step 5)."""
        ba = 1 << ((self.hada_n - 1).bit_length() // 2)
        return ba, self.hada_n // ba

    def is_global(self, layer: int) -> bool:
        return layer in self.global_layers

    def layer_window(self, layer: int) -> int:
        """Attention window of a layer under full-causal semantics (0 = unbounded)."""
        if self.is_global(layer) or self.sliding_window <= 0:
            return 0
        return self.sliding_window


# the fields of header words 1.. in order (word 0 is the format tag; None: words 17-18, the
# 64-bit mask of global layers, read apart)
HEADER_WORDS = (
    "num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab", "out_vocab", "d_model",
    "num_heads", "num_kv_heads", "num_layers", "qk_head_dim", "v_head_dim", "max_seq_len",
    "hada_n", "mhc_lanes", "sliding_window", None, None, "qkv_conv_taps", "engram_slots",
    "engram_sub_dim", "num_engram_tables", "engram_conv_taps", "engram_conv_dilation",
    "engram_seed_heads",
)


def parse_header(words: tuple[int, ...], rope_theta: float) -> dict:
    """Map the 48 header u32 (already unpacked) onto V3Config field values."""
    mask = words[17] | (words[18] << 32)
    values = common.header_fields(words, rope_theta, HEADER_WORDS, orders_at=26, sites_at=31,
                           max_sites=16)
    layers = values["num_layers"]
    values["global_layers"] = tuple(i for i in range(min(layers, 64)) if mask >> i & 1)
    return values


# Tensor layout ----------------------------------------------------------------------------
# (name, dtype, shape) in archive order; dtype "fp16" | "fp32" | "cq" | "raw". Head records
# are appended by the archive reader from the manifest, since their sizes live only in
# their own records.


def tensor_layout(cfg: V3Config) -> list[tuple[str, str, tuple[int, ...]]]:
    """Every record up to and including `final_norm`, in archive order (README 1-6)."""
    d, n, L = cfg.d_model, cfg.mhc_lanes, cfg.num_layers
    H, KV, qk, v = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
    N = cfg.hada_n
    ba, bb = cfg.hada_blocks
    out: list[tuple[str, str, tuple[int, ...]]] = [("embedding", "cq", (cfg.vocab, d))]
    for layer in range(L):
        p = f"layer{layer:02d}."
        first, then = common.attention_records(p, d, H, KV, qk, v)
        out += first
        if cfg.qkv_conv_taps > 0:
            t = cfg.qkv_conv_taps
            out += [
                (p + "q_taps", "fp16", (t, H * qk)),
                (p + "k_taps", "fp16", (t, KV * qk)),
                (p + "v_taps", "fp16", (t, KV * v)),
            ]
        out += then
        out += [(p + name, "fp16", (N,)) for name in ("d1", "d2", "b2", "d3", "d4")]
        for stage in ("1", "2", "3"):
            out += [(p + f"w{stage}a", "fp16", (ba, ba)), (p + f"w{stage}b", "fp16", (bb, bb))]
        out += [(p + "cond_v", "fp16", (d, COND_RANK)), (p + "cond_u", "fp16", (COND_RANK, N))]
    out += common.mhc_records(L, n, d)
    out += [
        ("hada_p1", "fp32", (N,)),
        ("hada_p2", "fp32", (N,)),
    ]
    out += common.engram_records(cfg, d)
    out.append(("final_norm", "fp16", (d,)))
    return out


# Probe heads (README step 7): manifest codes and the records each head carries.
HEAD_CODES = {1: "embedding_head", 2: "confidence_head", 3: "router_head"}
HEAD_RECORDS = ("probes", "gain", "query", "row_bias", "proj", "bias")
ROUTER_EXTRA = ("calibration",)
