"""Needle 3 weights, prepared once at load (fixture README "The `.cact` archive", "CQ tensors",
"Forward pass").

A CQ group dequantises to `(codebook[idx] * norm) @ H` (H the normalised 128 x 128 Sylvester
Hadamard matrix, symmetric and orthonormal). Every matrix used in a product is stored
pre-transposed `[in, out]` (C-contiguous) so that activations multiply as `x @ W` (BLAS);
matrices that read the same input are fused: q/k/v/gate per layer,
phi_pre/phi_post/phi_res per layer, engram key/value per site. All of them are views into one
float32 arena (`weight_cache`: one allocation, or a mapped cache file). Each is built in place:
a byte-LUT gather of `codebook[idx] * norm` straight into the transposed layout
(`kernels.cq.rotated_into`), then `W^T = H R^T` one 128-row block at a time, which is
bit-identical to `kernels.cq.dequantize` (the fixtures' `deq_*` samples).

Why the products stay in the dequantised domain: `x @ W^T == fwht_groups(x) @ R^T` would skip
the Hadamard product at load, but it drops upstream's float32 rounding of W, and under deploy
numerics (README "Deploy quantization") every such ulp can flip an A8 code: measured on the
fixtures, deploy logits drift from upstream by up to 1.5x more (rms 0.19 -> 0.28 on small p3,
past the parity bound). The one exception is the LM head (`lm_head`, rotated domain:
`rotate(hidden) @ lm_head`): no quantiser follows it, so the drift is float noise on the
logits only.

The tied embedding is not held in float: its rows are gathered from the CQ tensor per token
(`embedding_rows`, the exact dequantised rows). The engram tables are likewise only
row-gathered. Norm scales are stored as `1 + scale` (the zero-centred RMS norm's multiplier).

For a ladder rung (`kept` = block indices of the full model), each kept block keeps its weights
and takes its new index for the mHC lane one-hot (README "Ladder").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...formats.cact import CactArchive, CQTensor
from ...formats.needle3_geometry import V3Config
from ...kernels.cq import dequantize_rows, rotated_into
from ...kernels.fwht import fwht_groups, hadamard_matrix
from ...kernels.wtypes import WeightType
from .. import weight_cache
from ..ops import sigmoid

F32 = np.float32
# Hadamard size of the rotated domain: CQ's group (README "CQ tensors"). A rotated matrix
# stored at another group, or in FP16, is dequantised and re-rotated to this one at load.
ROTATION = 128
# Rows dequantised per step while filling the arena (a [rows, in] float block stays in L2).
CHUNK_ROWS = 128
# Narrower slots (phi: 24 columns) skip the transposed build: BLAS takes other kernels for so
# few columns, whose sums differ from `dequantize`'s in the last bit (the spot check would
# reject them anyway).
WIDE = 64


def rotate(x: np.ndarray) -> np.ndarray:
    """An activation [..., in] in the rotated domain [..., in padded to ROTATION]."""
    return fwht_groups(x, ROTATION)


def rotated_width(cols: int) -> int:
    return -(-cols // ROTATION) * ROTATION


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
    # the native MLP call's pointer tables for these weights (`kernels.pinned
    # .hadamard_mlp_native`), built on its first call and freed with the weights
    native_tables: list = field(default_factory=list, compare=False, repr=False)


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
    embedding_table: CQTensor | np.ndarray  # [vocab, d] as stored: rows via embedding_rows
    lm_head: np.ndarray  # rotated [pad(d), logits_vocab]: rotate(hidden) @ lm_head
    layers: tuple[LayerWeights, ...]
    engram: tuple[EngramSite, ...]
    final_norm: np.ndarray
    hada_p1: np.ndarray  # int64 [hada_n]
    hada_p2: np.ndarray
    confidence: ConfidenceWeights | None
    embedding_type: WeightType | None = None  # the table's weight type: its row gather

    def embedding_rows(self, tokens: np.ndarray | list[int]) -> np.ndarray:
        """Dequantised embedding rows [len(tokens), d] (bit-identical to the full matrix's)."""
        return self.embedding_type.gather(self.embedding_table, tokens)


# -- the matrix arena ------------------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    """One `[in, out]` matrix of the arena: the row ranges of stored matrices it fuses."""

    key: str
    parts: tuple[tuple[str, int, int], ...]  # (record name, first row, end row)
    rotated: bool  # rotated domain (in = width padded to ROTATION) or dequantised (in = cols)
    shape: tuple[int, int]


def _slot(archive: CactArchive, key: str, parts: list, rotated: bool = False) -> Slot:
    full = []
    cols = None
    for part in parts:
        name, first, end = part if isinstance(part, tuple) else (part, 0, None)
        record = archive.record(name)
        width = int(np.prod(record.shape[1:]))
        if cols is not None and width != cols:
            raise ValueError(f"{key}: fused parts read different widths ({cols}, {width})")
        cols = width
        full.append((name, first, record.shape[0] if end is None else end))
    width = rotated_width(cols) if rotated else cols
    return Slot(key, tuple(full), rotated, (width, sum(end - first for _, first, end in full)))


def plan(archive: CactArchive, cfg: V3Config, kept: tuple[int, ...]) -> list[Slot]:
    """The arena's matrices for the rung keeping blocks `kept` (`cfg` = rung geometry)."""
    n = cfg.mhc_lanes
    slots = []
    for new, old in enumerate(kept):
        p = f"layer{old:02d}."
        parts = [p + part for part in ("q_proj", "k_proj", "v_proj", "gate_proj")]
        slots.append(_slot(archive, f"{new}.qkvg", parts))
        slots.append(_slot(archive, f"{new}.out_proj", [p + "out_proj"]))
        phi = [
            ("mhc_phi_pre", old * n, (old + 1) * n),
            ("mhc_phi_post", old * n, (old + 1) * n),
            ("mhc_phi_res", old * n * n, (old + 1) * n * n),
        ]
        slots.append(_slot(archive, f"{new}.phi", phi))
    for site in _kept_sites(archive, kept):
        parts = [f"engram{site}.key_proj", f"engram{site}.value_proj"]
        slots.append(_slot(archive, f"engram{site}.key_value", parts))
    slots.append(_slot(archive, "lm_head", [("embedding", 0, cfg.logits_vocab)], rotated=True))
    return slots


class Filler:
    """Builds arena slots in place. A CQ slot is gathered as `R^T` (`codebook[idx] * norm`,
    transposed) into a scratch reused by every slot, then dequantised as `W^T = H R^T` one
    128-row block at a time straight into the arena; the LM head stays rotated (no H)."""

    def __init__(self, archive: CactArchive) -> None:
        self.archive = archive
        self.scratch = np.empty(0, F32)

    def __call__(self, slot: Slot, out: np.ndarray) -> None:
        archive = self.archive
        names = [name for name, _, _ in slot.parts]
        if not all(archive.wtype(name).kind == "cq" and archive.record(name).group == ROTATION
                   for name in names):
            self._by_rows(slot, out)
        elif slot.rotated:
            for column, name, rows in _columns(slot):
                dest = out[:, column : column + rows.stop - rows.start]
                rotated_into(archive.cq(name), dest, rows)
        elif out.shape[1] < WIDE or not self._transposed(slot, out):
            self._by_rows(slot, out)

    def _transposed(self, slot: Slot, out: np.ndarray) -> bool:
        """`W^T = H R^T` per block: the same products and sums as `dequantize`'s `R @ H` (H is
        symmetric), so BLAS gives the same bits; spot-checked against `dequantize_rows` (first
        and last row of each part: main and tail kernels), False if any differs."""
        archive = self.archive
        cols, width = out.shape
        in_pad = rotated_width(cols)
        if self.scratch.size < in_pad * width:
            self.scratch = np.empty(in_pad * width, F32)
        rotated = self.scratch[: in_pad * width].reshape(in_pad, width)
        for column, name, rows in _columns(slot):
            dest = rotated[:, column : column + rows.stop - rows.start]
            rotated_into(archive.cq(name), dest, rows)
        hadamard = hadamard_matrix(ROTATION)
        for first in range(0, cols, ROTATION):
            block = rotated[first : first + ROTATION]
            if first + ROTATION <= cols:
                np.matmul(hadamard, block, out=out[first : first + ROTATION])
            else:  # the padded tail of the last group is dropped, as `dequantize` does
                out[first:] = (hadamard @ block)[: cols - first]
        for column, name, rows in _columns(slot):
            for row in {rows.start, rows.stop - 1}:
                expected = dequantize_rows(archive.cq(name), slice(row, row + 1))[0]
                if not np.array_equal(out[:, column + row - rows.start], expected):
                    return False
        return True

    def _by_rows(self, slot: Slot, out: np.ndarray) -> None:
        """Any storage: `dequantize_rows` (or the FP16 cast) a few rows at a time, transposed
        into place (rotated again for a rotated slot)."""
        archive = self.archive
        for column, name, rows in _columns(slot):
            record = archive.record(name)
            cq = archive.cq(name) if archive.wtype(name).kind == "cq" else None
            for first in range(rows.start, rows.stop, CHUNK_ROWS):
                last = min(rows.stop, first + CHUNK_ROWS)
                if cq is not None:
                    block = dequantize_rows(cq, slice(first, last))
                else:
                    block = archive.floats(name).reshape(record.shape[0], -1)[first:last]
                if slot.rotated:
                    block = fwht_groups(block, ROTATION)
                out[:, column + first - rows.start : column + last - rows.start] = block.T


def _columns(slot: Slot):
    """(first output column, record name, row slice) of each part of a slot."""
    column = 0
    for name, first, end in slot.parts:
        yield column, name, slice(first, end)
        column += end - first


def _kept_sites(archive: CactArchive, kept: tuple[int, ...]) -> list[int]:
    return [s for s, layer in enumerate(archive.config.engram_sites) if layer in kept]


# -- small parameters ------------------------------------------------------------------------
def _one_plus(archive: CactArchive, name: str) -> np.ndarray:
    return F32(1.0) + archive.floats(name)


def _mhc(archive: CactArchive, cfg: V3Config, old: int, new: int, phi: np.ndarray) -> MhcWeights:
    n = cfg.mhc_lanes
    lane = np.zeros(n, F32)
    lane[new % n] = 1.0
    return MhcWeights(
        phi=phi,
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
    archive: CactArchive, cfg: V3Config, old: int, new: int, mats: dict, sites: dict
) -> LayerWeights:
    p = f"layer{old:02d}."
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
        qkvg=mats[f"{new}.qkvg"],
        qkv_taps=taps,
        q_norm=_one_plus(archive, p + "q_norm"),
        k_norm=_one_plus(archive, p + "k_norm"),
        out_proj=mats[f"{new}.out_proj"],
        post_norm=_one_plus(archive, p + "post_norm"),
        attn_gate=F32(sigmoid(gate_logit)),
        pre_hada=_one_plus(archive, p + "pre_hada"),
        mlp=mlp,
        mhc=_mhc(archive, cfg, old, new, mats[f"{new}.phi"]),
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


def load_weights(
    archive: CactArchive,
    cfg: V3Config,
    kept: tuple[int, ...],
    cache: bool | None = None,
    products: Callable[[CactArchive, list[Slot]], dict] | None = None,
) -> V3Weights:
    """Prepare every weight the rung keeping blocks `kept` needs. `cfg` is the rung geometry;
    `cache` as `weight_cache.arena` (None: on unless NEEDLEPOINT_CACHE=0). `products` builds
    the product slots instead of the float arena (deploy numerics: `exact_weights.exact_slots`,
    packed CQ rows of the archive, nothing cached)."""
    slots = plan(archive, cfg, kept)
    if products is not None:
        mats = products(archive, slots)
    else:
        mats = weight_cache.arena(archive, slots, Filler(archive), cache)
        # the packed matrices were read once to build the arena (or not at all, from the
        # cache): their pages need not count in this process's RSS (README "The `.cact` archive")
        archive.release(sorted({name for slot in slots for name, _, _ in slot.parts}))
    full = archive.config
    kept_sites = _kept_sites(archive, kept)
    sites = {full.engram_sites[s]: i for i, s in enumerate(kept_sites)}
    layers = tuple(
        _layer(archive, cfg, old, new, mats, sites) for new, old in enumerate(kept)
    )
    engram = tuple(
        EngramSite(
            tables=archive.cq(f"engram{s}.tables"),
            key_value=mats[f"engram{s}.key_value"],
            taps=archive.floats(f"engram{s}.taps"),
        )
        for s in kept_sites
    )
    return V3Weights(
        embedding_table=archive.table("embedding"),
        embedding_type=archive.wtype("embedding"),
        lm_head=mats["lm_head"],
        layers=layers,
        engram=engram,
        final_norm=_one_plus(archive, "final_norm"),
        hada_p1=archive.floats("hada_p1").astype(np.int64),
        hada_p2=archive.floats("hada_p2").astype(np.int64),
        confidence=_confidence(archive, cfg, kept),
    )
