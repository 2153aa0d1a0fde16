"""Header and record pieces that the Needle 2 and Needle 3 `.cact` layouts share.

Both headers are little-endian u32 words followed by one f32 rope_theta, and both archives
carry the same mHC and engram records after the layers (needle2 README "The v2 `.cact`
layout" steps 3-4, fixture README "The `.cact` archive" steps 4-6); one copy here keeps the
two geometries from drifting apart (one of each thing).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

Record = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True)
class CactGeometry:
    """The header fields both generations carry (`V2Config`, `V3Config` add their own);
    field names follow the READMEs' header lists."""

    num_tensors: int
    codebook_len: int
    kv_window: int
    kv_bits: int
    vocab: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    max_seq_len: int
    hada_n: int
    mhc_lanes: int
    engram_slots: int
    engram_sub_dim: int
    num_engram_tables: int
    engram_conv_taps: int
    engram_conv_dilation: int
    engram_orders: tuple[int, ...]
    engram_sites: tuple[int, ...]
    rope_theta: float

    @property
    def engram_heads(self) -> int:
        """Hash heads per n-gram order (tables = orders x heads)."""
        return self.num_engram_tables // max(1, len(self.engram_orders))


def unpack_words(data: bytes | memoryview, n_u32: int) -> tuple[tuple[int, ...], float]:
    """The header's `n_u32` words and the f32 rope_theta right after them."""
    words = struct.unpack_from(f"<{n_u32}I", data, 0)
    (rope_theta,) = struct.unpack_from("<f", data, n_u32 * 4)
    return words, rope_theta


def header_fields(words: tuple[int, ...], rope_theta: float,
                  names: tuple[str | None, ...], orders_at: int, sites_at: int,
                  max_sites: int) -> dict:
    """A header's config field values: `names[i]` is word 1 + i (None: a word read apart);
    the engram orders (at most 4) and sites (at most `max_sites`) are counted lists, the
    count at `orders_at` / `sites_at` and the items after it; the stored counts are kept as
    `_n_orders` / `_n_sites` for `cact_checks`."""
    n_orders, n_sites = words[orders_at], words[sites_at]
    values = {name: words[1 + i] for i, name in enumerate(names) if name is not None}
    return dict(values,
                engram_orders=tuple(words[orders_at + 1 : orders_at + 1 + min(n_orders, 4)]),
                engram_sites=tuple(words[sites_at + 1 : sites_at + 1 + min(n_sites, max_sites)]),
                rope_theta=rope_theta, _n_orders=n_orders, _n_sites=n_sites)


def attention_records(p: str, d: int, heads: int, kv_heads: int, qk: int,
                      v: int) -> tuple[list[Record], list[Record]]:
    """A block's attention records under prefix `p`, in archive order: (the input norm and
    q / k / v projections, then the q / k norms, gate and output projections, post-norm,
    attention gate and the MLP's pre-Hadamard scale); Needle 3 stores its q / k / v taps
    between the two."""
    H, KV = heads, kv_heads
    first = [
        (p + "norm_in", "fp16", (d,)),
        (p + "q_proj", "cq", (H * qk, d)),
        (p + "k_proj", "cq", (KV * qk, d)),
        (p + "v_proj", "cq", (KV * v, d)),
    ]
    then = [
        (p + "q_norm", "fp16", (qk,)),
        (p + "k_norm", "fp16", (qk,)),
        (p + "gate_proj", "cq", (H * v, d)),
        (p + "out_proj", "cq", (d, H * v)),
        (p + "post_norm", "fp16", (d,)),
        (p + "attn_gate", "fp16", (1,)),
        (p + "pre_hada", "fp16", (d,)),
    ]
    return first, then


def mhc_records(layers: int, lanes: int, d_model: int) -> list[Record]:
    """The mHC coefficient records, in archive order."""
    L, n, d = layers, lanes, d_model
    return [
        ("mhc_a_pre", "fp16", (L,)),
        ("mhc_a_post", "fp16", (L,)),
        ("mhc_a_res", "fp16", (L,)),
        ("mhc_b_pre", "fp16", (L, n)),
        ("mhc_b_post", "fp16", (L, n)),
        ("mhc_b_res", "fp16", (L, n, n)),
        ("mhc_phi_pre", "cq", (L * n, n * d)),
        ("mhc_phi_post", "cq", (L * n, n * d)),
        ("mhc_phi_res", "cq", (L * n * n, n * d)),
    ]


def engram_records(cfg: CactGeometry, d_model: int) -> list[Record]:
    """Every engram site's records, in archive order."""
    d = d_model
    width = cfg.num_engram_tables * cfg.engram_sub_dim
    out: list[Record] = []
    for site in range(len(cfg.engram_sites)):
        p = f"engram{site}."
        out += [
            (p + "tables", "cq", (cfg.num_engram_tables * cfg.engram_slots, cfg.engram_sub_dim)),
            (p + "key_proj", "cq", (d, width)),
            (p + "value_proj", "cq", (d, width)),
            (p + "taps", "fp16", (cfg.engram_conv_taps, d)),
        ]
    return out
