"""Needle 2 weights, decoded once at load into the layouts the forward pass multiplies with.

Every CQ matrix except the engram tables is dequantised to float32 once (needle2 README
"Cactus-Quants") and stored transposed, `[in, out]`, so a step is `x @ W` on BLAS. Matrices
that read the same activation are fused: q/k/v/gate, the three mHC maps of a layer, and an
engram site's key/value projections. The engram tables stay packed and are gathered per
row on demand (a shipped site holds 4 x 8192 rows, of which a token reads 4).

Norm scales are kept as their gains `1 + scale` and the attention gate as its sigmoid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formats.cact import CactArchive, CQTensor
from ...formats.needle2_geometry import V2Config
from ..ops import sigmoid
from .ladder import kept_engram_sites


@dataclass(frozen=True)
class LayerWeights:
    """One block (README "Forward pass" 3, the `block:` bullet)."""

    norm_in: np.ndarray  # [C] gain 1 + scale
    w_qkvg: np.ndarray  # [C, H*hd + 2*KV*hd + H*hd]: q | k | v | gate
    q_norm: np.ndarray  # [hd] gain
    k_norm: np.ndarray  # [hd] gain
    w_out: np.ndarray  # [H*hd, C]
    post_norm: np.ndarray  # [C] gain
    attn_gate: np.float32  # sigmoid(attn_gate)
    pre_hada: np.ndarray  # [C] gain
    d1: np.ndarray  # [N] Hadamard MLP diagonals
    d2: np.ndarray  # [N]
    d3: np.ndarray  # [N]


@dataclass(frozen=True)
class MhcWeights:
    """One layer's mHC router (README "Forward pass" 3, hpre/hpost/hres)."""

    phi: np.ndarray  # [n*C, n + n + n*n]: pre | post | res columns
    a_pre: np.float32
    a_post: np.float32
    a_res: np.float32
    bias_pre: np.ndarray  # [n] b_pre + 8*onehot(i mod n) - 4
    bias_post: np.ndarray  # [n] b_post - 4*(1 - onehot(i mod n))
    b_res: np.ndarray  # [n, n]


@dataclass(frozen=True)
class EngramWeights:
    """One engram site (README "Forward pass" 2)."""

    layer: int  # block index (after ladder renumbering) that reads this site
    tables: CQTensor  # packed [tables*slots, sub_dim]; row t*slots + r
    w_kv: np.ndarray  # [tables*sub_dim, 2C]: key | value
    taps: np.ndarray  # [taps, C]


@dataclass(frozen=True)
class ProbeHead:
    """A probe head (README "Probe heads"): probes [P, C], proj^T [P*C, out], bias [out]."""

    probes: np.ndarray
    proj: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class V2Weights:
    embedding: np.ndarray  # [V, C] float32, the tied LM head too
    layers: tuple[LayerWeights, ...]
    mhc: tuple[MhcWeights, ...]
    engrams: tuple[EngramWeights, ...]
    final_norm: np.ndarray  # [C] gain
    contrastive: ProbeHead | None
    confidence: ProbeHead | None


def _gain(archive: CactArchive, name: str) -> np.ndarray:
    return np.float32(1.0) + archive.floats(name)


def _matrix_t(archive: CactArchive, name: str) -> np.ndarray:
    """A stored [out, in] matrix as float32 [in, out] (CQ dequantised, fp16 widened)."""
    return archive.floats(name).reshape(archive.record(name).shape[0], -1).T


def _layer(archive: CactArchive, cfg: V2Config, index: int) -> LayerWeights:
    p = f"layer{index:02d}."
    fused = np.concatenate(
        [_matrix_t(archive, p + part) for part in ("q_proj", "k_proj", "v_proj", "gate_proj")],
        axis=1,
    )
    return LayerWeights(
        norm_in=_gain(archive, p + "norm_in"),
        w_qkvg=np.ascontiguousarray(fused),
        q_norm=_gain(archive, p + "q_norm"),
        k_norm=_gain(archive, p + "k_norm"),
        w_out=np.ascontiguousarray(_matrix_t(archive, p + "out_proj")),
        post_norm=_gain(archive, p + "post_norm"),
        attn_gate=np.float32(sigmoid(archive.floats(p + "attn_gate"))[0]),
        pre_hada=_gain(archive, p + "pre_hada"),
        d1=archive.floats(p + "d1"),
        d2=archive.floats(p + "d2"),
        d3=archive.floats(p + "d3"),
    )


def _mhc(archive: CactArchive, cfg: V2Config, kept: tuple[int, ...]) -> tuple[MhcWeights, ...]:
    n = cfg.mhc_lanes
    # CQ records dequantised by their weight type (`CactArchive.floats`)
    phi_pre = archive.floats("mhc_phi_pre")
    phi_post = archive.floats("mhc_phi_post")
    phi_res = archive.floats("mhc_phi_res")
    a_pre, a_post, a_res = (archive.floats(f"mhc_a_{k}") for k in ("pre", "post", "res"))
    b_pre, b_post, b_res = (archive.floats(f"mhc_b_{k}") for k in ("pre", "post", "res"))
    out = []
    for new, old in enumerate(kept):
        # Lane offsets follow the block's index in this (possibly laddered) model.
        onehot = (np.arange(n) == new % n).astype(np.float32)
        phi = np.concatenate(
            [
                phi_pre[old * n : (old + 1) * n],
                phi_post[old * n : (old + 1) * n],
                phi_res[old * n * n : (old + 1) * n * n],
            ]
        )
        out.append(
            MhcWeights(
                phi=np.ascontiguousarray(phi.T),
                a_pre=np.float32(a_pre[old]),
                a_post=np.float32(a_post[old]),
                a_res=np.float32(a_res[old]),
                bias_pre=b_pre[old] + (np.float32(8.0) * onehot - np.float32(4.0)),
                bias_post=b_post[old] - np.float32(4.0) * (np.float32(1.0) - onehot),
                b_res=b_res[old],
            )
        )
    return tuple(out)


def _engrams(
    archive: CactArchive, full: V2Config, rung: V2Config, kept: tuple[int, ...]
) -> tuple[EngramWeights, ...]:
    out = []
    for site, layer in zip(kept_engram_sites(full, kept), rung.engram_sites, strict=True):
        p = f"engram{site}."
        w_kv = np.concatenate(
            [_matrix_t(archive, p + "key_proj"), _matrix_t(archive, p + "value_proj")], axis=1
        )
        out.append(
            EngramWeights(
                layer=layer,
                tables=archive.cq(p + "tables"),
                w_kv=np.ascontiguousarray(w_kv),
                taps=archive.floats(p + "taps"),
            )
        )
    return tuple(out)


def _head(archive: CactArchive, name: str) -> ProbeHead | None:
    if not archive.has(name + ".probes"):
        return None
    return ProbeHead(
        probes=archive.floats(name + ".probes"),
        proj=np.ascontiguousarray(_matrix_t(archive, name + ".proj")),
        bias=archive.floats(name + ".bias"),
    )


def load_weights(
    archive: CactArchive, full: V2Config, rung: V2Config, kept: tuple[int, ...]
) -> V2Weights:
    """Decode the blocks in `kept` (all of them for the full model) and the shared tensors."""
    return V2Weights(
        embedding=archive.floats("embedding"),
        layers=tuple(_layer(archive, full, index) for index in kept),
        mhc=_mhc(archive, full, kept),
        engrams=_engrams(archive, full, rung, kept),
        final_norm=_gain(archive, "final_norm"),
        contrastive=_head(archive, "contrastive_head"),
        confidence=_head(archive, "confidence_head"),
    )
