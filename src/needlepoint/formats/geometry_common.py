"""Header and record pieces that the Needle 2 and Needle 3 `.cact` layouts share.

Both headers are little-endian u32 words followed by one f32 rope_theta, and both archives
carry the same mHC and engram records after the layers (needle2 README "The v2 `.cact`
layout" steps 3-4, fixture README "The `.cact` archive" steps 4-6); one copy here keeps the
two geometries from drifting apart (one of each thing).
"""

from __future__ import annotations

import struct
from typing import Protocol

Record = tuple[str, str, tuple[int, ...]]


class EngramGeometry(Protocol):
    """The engram fields both configs carry."""

    num_engram_tables: int
    engram_sub_dim: int
    engram_slots: int
    engram_conv_taps: int
    engram_sites: tuple[int, ...]


def unpack_words(data: bytes | memoryview, n_u32: int) -> tuple[tuple[int, ...], float]:
    """The header's `n_u32` words and the f32 rope_theta right after them."""
    words = struct.unpack_from(f"<{n_u32}I", data, 0)
    (rope_theta,) = struct.unpack_from("<f", data, n_u32 * 4)
    return words, rope_theta


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


def engram_records(cfg: EngramGeometry, d_model: int) -> list[Record]:
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
