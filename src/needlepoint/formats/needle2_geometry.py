"""Needle 2 geometry, read from the `.cact` header (needle2 fixture README "The v2 `.cact` layout").

The header is 29 little-endian u32 followed by one f32 rope_theta (120 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from .geometry_common import engram_records, mhc_records, unpack_words

FORMAT_TAG = 0x05E12A83
HEADER_U32 = 29
HEADER_BYTES = HEADER_U32 * 4 + 4


@dataclass(frozen=True)
class V2Config:
    """Frozen Needle 2 geometry. Field names follow the needle2 README header list."""

    num_tensors: int
    codebook_len: int
    kv_window: int
    kv_bits: int
    vocab: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    head_dim: int
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
    generation: int = 2

    @property
    def logits_vocab(self) -> int:
        return self.vocab

    @property
    def engram_heads(self) -> int:
        return self.num_engram_tables // max(1, len(self.engram_orders))


def unpack_header(data: bytes | memoryview) -> tuple[tuple[int, ...], float]:
    return unpack_words(data, HEADER_U32)


def parse_header(words: tuple[int, ...], rope_theta: float) -> dict:
    n_orders = words[19]
    n_sites = words[24]
    return dict(
        num_tensors=words[1],
        codebook_len=words[2],
        kv_window=words[3],
        kv_bits=words[4],
        vocab=words[5],
        d_model=words[6],
        num_heads=words[7],
        num_kv_heads=words[8],
        num_layers=words[9],
        head_dim=words[10],
        max_seq_len=words[11],
        hada_n=words[12],
        mhc_lanes=words[13],
        engram_slots=words[14],
        engram_sub_dim=words[15],
        num_engram_tables=words[16],
        engram_conv_taps=words[17],
        engram_conv_dilation=words[18],
        engram_orders=tuple(words[20 : 20 + min(n_orders, 4)]),
        engram_sites=tuple(words[25 : 25 + min(n_sites, 4)]),
        rope_theta=rope_theta,
        _n_orders=n_orders,
        _n_sites=n_sites,
    )


def tensor_layout(cfg: V2Config) -> list[tuple[str, str, tuple[int, ...]]]:
    """Every record up to and including `final_norm`, in archive order (needle2 README 1-5)."""
    d, n, L = cfg.d_model, cfg.mhc_lanes, cfg.num_layers
    H, KV, hd, N = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hada_n
    out: list[tuple[str, str, tuple[int, ...]]] = [("embedding", "cq", (cfg.vocab, d))]
    for layer in range(L):
        p = f"layer{layer:02d}."
        out += [
            (p + "norm_in", "fp16", (d,)),
            (p + "q_proj", "cq", (H * hd, d)),
            (p + "k_proj", "cq", (KV * hd, d)),
            (p + "v_proj", "cq", (KV * hd, d)),
            (p + "q_norm", "fp16", (hd,)),
            (p + "k_norm", "fp16", (hd,)),
            (p + "gate_proj", "cq", (H * hd, d)),
            (p + "out_proj", "cq", (d, H * hd)),
            (p + "post_norm", "fp16", (d,)),
            (p + "attn_gate", "fp16", (1,)),
            (p + "pre_hada", "fp16", (d,)),
            (p + "d1", "fp16", (N,)),
            (p + "d2", "fp16", (N,)),
            (p + "d3", "fp16", (N,)),
        ]
    out += mhc_records(L, n, d)
    out += engram_records(cfg, d)
    out.append(("final_norm", "fp16", (d,)))
    return out


# Probe heads (needle2 README step 6): codes and the records each head carries.
HEAD_CODES = {1: "contrastive_head", 2: "confidence_head"}
HEAD_RECORDS = ("probes", "proj", "bias")
