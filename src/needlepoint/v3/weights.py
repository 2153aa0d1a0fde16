"""Needle 3 weights, decoded once at load (fixture README "The `.cact` archive", "Forward pass").

Every CQ matrix used as a matmul is dequantised to float32 and stored pre-transposed
`[in, out]` (C-contiguous) so that activations multiply as `x @ W` through BLAS. Matrices that
read the same input are fused: q/k/v/gate per layer, phi_pre/phi_post/phi_res per layer, and
engram key/value per site. The engram tables are *not* dequantised: they are only ever
row-gathered (`kernels.cq.dequantize_rows`). Norm scales are stored as `1 + scale` (the
zero-centred RMS norm's multiplier).

For a ladder rung (`kept` = block indices of the full model), each kept block keeps its weights
and takes its new index for the mHC lane one-hot (README "Ladder").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cact import CactArchive
from ..kernels.cq import dequantize
from .config import V3Config

F32 = np.float32


@dataclass(frozen=True)
class MlpWeights:
    """Hadamard (Monarch) MLP of one block (README step 5, `HadamardMLP`)."""

    d1: np.ndarray
    d2: np.ndarray
    b2: np.ndarray
    d3: np.ndarray
    d4: np.ndarray
    stages: tuple[tuple[np.ndarray, np.ndarray], ...]  # (wsa, wsb) for s = 1, 2, 3
    cond_v: np.ndarray  # [d, 8]
    cond_u: np.ndarray  # [8, hada_n]


@dataclass(frozen=True)
class MhcWeights:
    """mHC routing of one block: `phi` = [phi_pre; phi_post; phi_res] rows, transposed."""

    phi: np.ndarray  # [n*d, n + n + n*n]
    a_pre: np.float32
    a_post: np.float32
    a_res: np.float32
    b_pre: np.ndarray  # [n]
    b_post: np.ndarray
    pre_offset: np.ndarray  # 8 e_l - 4
    post_offset: np.ndarray  # -4 (1 - e_l)
    b_res: np.ndarray  # [n, n]


@dataclass(frozen=True)
class LayerWeights:
    norm_in: np.ndarray  # 1 + scale, [d]
    qkvg: np.ndarray  # [d, q_dim + k_dim + v_dim + gate_dim]
    qkv_taps: np.ndarray | None  # [taps, q_dim + k_dim + v_dim]
    q_norm: np.ndarray  # 1 + scale, [qk]
    k_norm: np.ndarray
    out_proj: np.ndarray  # [H*v, d]
    post_norm: np.ndarray
    attn_gate: np.float32  # sigmoid(stored logit)
    pre_hada: np.ndarray
    mlp: MlpWeights
    mhc: MhcWeights
    window: int  # full-causal attention window of this block (0 = unbounded)
    engram_site: int | None  # index into V3Weights.engram, or None


@dataclass(frozen=True)
class EngramSite:
    tables: object  # CQTensor [tables*slots, sub_dim], row-gathered on demand
    key_value: np.ndarray  # [tables*sub_dim, 2d]: key_proj^T | value_proj^T
    taps: np.ndarray  # [conv_taps, d]


@dataclass(frozen=True)
class ConfidenceWeights:
    """Confidence probe head (README step 7), cell rows already sliced for a ladder rung."""

    probes: np.ndarray  # [cells, k, d]
    gain: np.ndarray  # [cells, k]
    query: np.ndarray  # [q, d]
    row_bias: np.ndarray  # [q, cells, k]
    proj: np.ndarray  # [out, q*d]
    bias: np.ndarray  # [out]


@dataclass(frozen=True)
class V3Weights:
    embedding: np.ndarray  # [vocab, d] dequantised (row gather)
    lm_head: np.ndarray  # [d, logits_vocab] = embedding[:V]^T, contiguous
    layers: tuple[LayerWeights, ...]
    engram: tuple[EngramSite, ...]
    final_norm: np.ndarray
    hada_p1: np.ndarray  # int64 [hada_n]
    hada_p2: np.ndarray
    confidence: ConfidenceWeights | None


def _one_plus(archive: CactArchive, name: str) -> np.ndarray:
    return F32(1.0) + archive.floats(name)


def _matrix_t(archive: CactArchive, name: str) -> np.ndarray:
    """A stored `[out, in]` matrix as float32 `[in, out]` (CQ dequantised, FP16 cast)."""
    record = archive.record(name)
    matrix = dequantize(archive.cq(name)) if record.dtype == "cq" else archive.floats(name)
    return matrix.reshape(record.shape[0], -1).T


def _mhc(archive: CactArchive, cfg: V3Config, old: int, new: int, phi: dict) -> MhcWeights:
    n = cfg.mhc_lanes
    lane = np.zeros(n, F32)
    lane[new % n] = 1.0
    rows = np.concatenate(
        [
            phi["pre"][old * n : (old + 1) * n],
            phi["post"][old * n : (old + 1) * n],
            phi["res"][old * n * n : (old + 1) * n * n],
        ]
    )
    return MhcWeights(
        phi=np.ascontiguousarray(rows.T),
        a_pre=F32(archive.floats("mhc_a_pre")[old]),
        a_post=F32(archive.floats("mhc_a_post")[old]),
        a_res=F32(archive.floats("mhc_a_res")[old]),
        b_pre=archive.floats("mhc_b_pre")[old],
        b_post=archive.floats("mhc_b_post")[old],
        pre_offset=F32(8.0) * lane - F32(4.0),
        post_offset=F32(-4.0) * (F32(1.0) - lane),
        b_res=archive.floats("mhc_b_res")[old],
    )


def _layer(
    archive: CactArchive, cfg: V3Config, old: int, new: int, phi: dict, sites: dict
) -> LayerWeights:
    p = f"layer{old:02d}."
    fused = np.concatenate(
        [_matrix_t(archive, p + part) for part in ("q_proj", "k_proj", "v_proj", "gate_proj")],
        axis=1,
    )
    taps = None
    if cfg.qkv_conv_taps > 0:
        taps = np.concatenate(
            [archive.floats(p + part) for part in ("q_taps", "k_taps", "v_taps")], axis=1
        )
    mlp = MlpWeights(
        d1=archive.floats(p + "d1"),
        d2=archive.floats(p + "d2"),
        b2=archive.floats(p + "b2"),
        d3=archive.floats(p + "d3"),
        d4=archive.floats(p + "d4"),
        stages=tuple(
            (archive.floats(p + f"w{s}a"), archive.floats(p + f"w{s}b")) for s in "123"
        ),
        cond_v=archive.floats(p + "cond_v"),
        cond_u=archive.floats(p + "cond_u"),
    )
    gate_logit = archive.floats(p + "attn_gate").reshape(())
    return LayerWeights(
        norm_in=_one_plus(archive, p + "norm_in"),
        qkvg=np.ascontiguousarray(fused),
        qkv_taps=taps,
        q_norm=_one_plus(archive, p + "q_norm"),
        k_norm=_one_plus(archive, p + "k_norm"),
        out_proj=np.ascontiguousarray(_matrix_t(archive, p + "out_proj")),
        post_norm=_one_plus(archive, p + "post_norm"),
        attn_gate=F32(1.0) / (F32(1.0) + np.exp(-gate_logit)),
        pre_hada=_one_plus(archive, p + "pre_hada"),
        mlp=mlp,
        mhc=_mhc(archive, cfg, old, new, phi),
        window=cfg.layer_window(new),
        engram_site=sites.get(old),
    )


def _confidence(archive: CactArchive, cfg: V3Config, kept: tuple[int, ...]):
    if "confidence_head" not in archive.heads:
        return None
    p = "confidence_head."
    d = cfg.d_model
    cells = [0] + [layer + 1 for layer in kept]
    gain = archive.floats(p + "gain")
    probes = archive.floats(p + "probes").reshape(gain.shape[0], gain.shape[1], d)
    return ConfidenceWeights(
        probes=np.ascontiguousarray(probes[cells]),
        gain=np.ascontiguousarray(gain[cells]),
        query=archive.floats(p + "query").reshape(-1, d),
        row_bias=np.ascontiguousarray(archive.floats(p + "row_bias")[:, cells]),
        proj=archive.floats(p + "proj").reshape(-1, archive.record(p + "query").shape[0] * d),
        bias=archive.floats(p + "bias").reshape(-1),
    )


def load_weights(archive: CactArchive, cfg: V3Config, kept: tuple[int, ...]) -> V3Weights:
    """Decode every weight the rung keeping blocks `kept` needs. `cfg` is the rung geometry."""
    full = archive.config
    phi = {
        "pre": archive.floats("mhc_phi_pre"),
        "post": archive.floats("mhc_phi_post"),
        "res": archive.floats("mhc_phi_res"),
    }
    kept_sites = [s for s, layer in enumerate(full.engram_sites) if layer in kept]
    sites = {full.engram_sites[s]: i for i, s in enumerate(kept_sites)}
    layers = tuple(
        _layer(archive, cfg, old, new, phi, sites) for new, old in enumerate(kept)
    )
    engram = tuple(
        EngramSite(
            tables=archive.cq(f"engram{s}.tables"),
            key_value=np.ascontiguousarray(
                np.concatenate(
                    [
                        _matrix_t(archive, f"engram{s}.key_proj"),
                        _matrix_t(archive, f"engram{s}.value_proj"),
                    ],
                    axis=1,
                )
            ),
            taps=archive.floats(f"engram{s}.taps"),
        )
        for s in kept_sites
    )
    embedding = archive.floats("embedding")
    return V3Weights(
        embedding=embedding,
        lm_head=np.ascontiguousarray(embedding[: cfg.logits_vocab].T),
        layers=layers,
        engram=engram,
        final_norm=_one_plus(archive, "final_norm"),
        hada_p1=archive.floats("hada_p1").astype(np.int64),
        hada_p2=archive.floats("hada_p2").astype(np.int64),
        confidence=_confidence(archive, cfg, kept),
    )
