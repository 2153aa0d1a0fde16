"""Needle 3 geometry (an archive's `V3Config`), read from the `.cact` header (fixture README
"The `.cact` archive").

The header is 48 little-endian u32 followed by one f32 rope_theta (196 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from .geometry_common import engram_records, mhc_records, unpack_words

FORMAT_TAG = 0x05E12A84
HEADER_U32 = 48
HEADER_BYTES = HEADER_U32 * 4 + 4
# Hadamard-MLP conditioning rank: `cond_v` is [d, 8] in every archive (README record list).
COND_RANK = 8


@dataclass(frozen=True)
class V3Config:
    """Frozen Needle 3 geometry. Field names follow the fixture README's header table."""

    num_tensors: int
    codebook_len: int
    kv_window: int
    kv_bits: int
    vocab: int
    out_vocab: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    qk_head_dim: int
    v_head_dim: int
    max_seq_len: int
    hada_n: int
    mhc_lanes: int
    sliding_window: int
    global_layers: tuple[int, ...]
    qkv_conv_taps: int
    engram_slots: int
    engram_sub_dim: int
    num_engram_tables: int
    engram_conv_taps: int
    engram_conv_dilation: int
    engram_seed_heads: int
    engram_orders: tuple[int, ...]
    engram_sites: tuple[int, ...]
    rope_theta: float
    generation: int = 3

    @property
    def logits_vocab(self) -> int:
        """Rows of the tied embedding that are logits (`out_vocab` 0 = all of them)."""
        return self.out_vocab if self.out_vocab else self.vocab

    @property
    def engram_heads(self) -> int:
        """Hash heads per n-gram order (tables = orders x heads)."""
        return self.num_engram_tables // max(1, len(self.engram_orders))

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


def parse_header(words: tuple[int, ...], rope_theta: float) -> dict:
    """Map the 48 header u32 (already unpacked) onto V3Config field values."""
    mask = words[17] | (words[18] << 32)
    num_layers = words[10]
    n_orders = words[26]
    n_sites = words[31]
    return dict(
        num_tensors=words[1],
        codebook_len=words[2],
        kv_window=words[3],
        kv_bits=words[4],
        vocab=words[5],
        out_vocab=words[6],
        d_model=words[7],
        num_heads=words[8],
        num_kv_heads=words[9],
        num_layers=num_layers,
        qk_head_dim=words[11],
        v_head_dim=words[12],
        max_seq_len=words[13],
        hada_n=words[14],
        mhc_lanes=words[15],
        sliding_window=words[16],
        global_layers=tuple(i for i in range(min(num_layers, 64)) if mask >> i & 1),
        qkv_conv_taps=words[19],
        engram_slots=words[20],
        engram_sub_dim=words[21],
        num_engram_tables=words[22],
        engram_conv_taps=words[23],
        engram_conv_dilation=words[24],
        engram_seed_heads=words[25],
        engram_orders=tuple(words[27 : 27 + min(n_orders, 4)]),
        engram_sites=tuple(words[32 : 32 + min(n_sites, 16)]),
        rope_theta=rope_theta,
        _n_orders=n_orders,
        _n_sites=n_sites,
    )


def unpack_header(data: bytes | memoryview) -> tuple[tuple[int, ...], float]:
    return unpack_words(data, HEADER_U32)


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
        out += [
            (p + "norm_in", "fp16", (d,)),
            (p + "q_proj", "cq", (H * qk, d)),
            (p + "k_proj", "cq", (KV * qk, d)),
            (p + "v_proj", "cq", (KV * v, d)),
        ]
        if cfg.qkv_conv_taps > 0:
            t = cfg.qkv_conv_taps
            out += [
                (p + "q_taps", "fp16", (t, H * qk)),
                (p + "k_taps", "fp16", (t, KV * qk)),
                (p + "v_taps", "fp16", (t, KV * v)),
            ]
        out += [
            (p + "q_norm", "fp16", (qk,)),
            (p + "k_norm", "fp16", (qk,)),
            (p + "gate_proj", "cq", (H * v, d)),
            (p + "out_proj", "cq", (d, H * v)),
            (p + "post_norm", "fp16", (d,)),
            (p + "attn_gate", "fp16", (1,)),
            (p + "pre_hada", "fp16", (d,)),
        ]
        out += [(p + name, "fp16", (N,)) for name in ("d1", "d2", "b2", "d3", "d4")]
        for stage in ("1", "2", "3"):
            out += [(p + f"w{stage}a", "fp16", (ba, ba)), (p + f"w{stage}b", "fp16", (bb, bb))]
        out += [(p + "cond_v", "fp16", (d, COND_RANK)), (p + "cond_u", "fp16", (COND_RANK, N))]
    out += mhc_records(L, n, d)
    out += [
        ("hada_p1", "fp32", (N,)),
        ("hada_p2", "fp32", (N,)),
    ]
    out += engram_records(cfg, d)
    out.append(("final_norm", "fp16", (d,)))
    return out


# Probe heads (README step 7): manifest codes and the records each head carries.
HEAD_CODES = {1: "embedding_head", 2: "confidence_head", 3: "router_head"}
HEAD_RECORDS = ("probes", "gain", "query", "row_bias", "proj", "bias")
ROUTER_EXTRA = ("calibration",)
