"""Needle 2 geometry, read from the `.cact` header (needle2 fixture README "The v2 `.cact` layout").

The header is 29 little-endian u32 followed by one f32 rope_theta (120 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import geometry_common as common

FORMAT_TAG = 0x05E12A83
HEADER_U32 = 29
HEADER_BYTES = HEADER_U32 * 4 + 4


@dataclass(frozen=True)
class V2Config(common.CactGeometry):
    """Frozen Needle 2 geometry. Field names follow the needle2 README header list."""

    head_dim: int
    generation: int = 2

    @property
    def logits_vocab(self) -> int:
        return self.vocab


# the fields of header words 1.. in order (word 0 is the format tag)
HEADER_WORDS = (
    "num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab", "d_model", "num_heads",
    "num_kv_heads", "num_layers", "head_dim", "max_seq_len", "hada_n", "mhc_lanes",
    "engram_slots", "engram_sub_dim", "num_engram_tables", "engram_conv_taps",
    "engram_conv_dilation",
)


def parse_header(words: tuple[int, ...], rope_theta: float) -> dict:
    """Map the 29 header u32 (already unpacked) onto V2Config field values."""
    return common.header_fields(words, rope_theta, HEADER_WORDS, orders_at=19, sites_at=24,
                         max_sites=4)


def tensor_layout(cfg: V2Config) -> list[tuple[str, str, tuple[int, ...]]]:
    """Every record up to and including `final_norm`, in archive order (needle2 README 1-5)."""
    d, n, L = cfg.d_model, cfg.mhc_lanes, cfg.num_layers
    hd, N = cfg.head_dim, cfg.hada_n
    out: list[tuple[str, str, tuple[int, ...]]] = [("embedding", "cq", (cfg.vocab, d))]
    for layer in range(L):
        p = f"layer{layer:02d}."
        first, then = common.attention_records(p, d, cfg.num_heads, cfg.num_kv_heads, hd, hd)
        out += first + then
        out += [(p + name, "fp16", (N,)) for name in ("d1", "d2", "d3")]
    out += common.mhc_records(L, n, d)
    out += common.engram_records(cfg, d)
    out.append(("final_norm", "fp16", (d,)))
    return out


# Probe heads (needle2 README step 6): codes and the records each head carries.
HEAD_CODES = {1: "contrastive_head", 2: "confidence_head"}
HEAD_RECORDS = ("probes", "proj", "bias")
