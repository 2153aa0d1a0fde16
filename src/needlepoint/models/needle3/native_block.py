"""The deploy forward of a batch of chunks in one native call (kernels/native/np_v3_block.h).

`native_plan(model)` is the model's weights as the C structs (built once per model by its
deploy numerics object, `numerics.NeedleDeploy.native_plan`), or None when the native library
is not loaded (no compiler, `NEEDLEPOINT_NATIVE=0`), the numerics are float, or the geometry
is one the C code does not take (`supported`); the forward then runs the numpy reference
(`block.run_block`), which computes the same bits.

`NativePlan.blocks` runs blocks `first .. last-1` for the rows of several sessions' chunks
(mHC, engram gate, attention over each session's own int8 cache, MLP, lane mixing) and
`NativePlan.readout` the final norm and the wanted LM-head rows. `NativePlan.step` runs the
whole forward (embedding rows, engram sites, every block, read-out) in one call, its scratch
kept between calls in the calling thread's arena (`Scratch`), so a decode step allocates no
native memory. A session's caches are numpy memory (`exact_attention.Int8LayerCache`) the C
code reads and writes in place.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import NonFiniteActivationError
from ...formats.needle3_geometry import V3Config
from ...kernels import native
from ...kernels.cq import _H128 as H128
from ...kernels.cq_tensor import CQTensor
from ...kernels.exact import GROUP, ExactMatrix
from ...kernels.wtypes import cq_type

if TYPE_CHECKING:  # pragma: no cover
    from .exact_attention import Int8LayerCache
    from .step import StepPlan
    from .weights import V3Weights

F32 = np.float32
# Rows up to which `step` keeps its scratch in the thread's arena: decode steps, drafts and
# the server's batched decode rows; a longer prefill chunk allocates its own (its scratch is
# MBs, not worth holding for the session's lifetime).
ARENA_ROWS = 64
STATUS = {1: "non-finite activation (or a Sinkhorn scaling out of range) in the native step",
          2: "out of memory in the native step", 3: "bad arguments to the native step"}


def _f32(array, keep: list) -> int:
    array = np.ascontiguousarray(array, F32)
    keep.append(array)
    return array.ctypes.data


def _product(matrices, keep: list) -> native.V3Product:
    """`np_v3_product` of a fused exact product (a list of ExactMatrix)."""
    mats = (native.V3Mat * len(matrices))(*[
        native.V3Mat(m.storage_bits, m.codebook.ctypes.data, m.codebook.size,
                     ctypes.addressof(m.c_parts()), len(m.parts))
        for m in matrices
    ])
    keep.append(mats)
    out = max(p.out_col + p.rows for m in matrices for p in m.parts)
    return native.V3Product(ctypes.addressof(mats), len(matrices), matrices[0].in_pad, out)


def supported(cfg: V3Config, weights: V3Weights) -> bool:
    """Whether the C step takes this geometry and these (deploy) weights: a part holding no
    block (a stage model's head) has nothing for it to run."""
    if cfg.qk_head_dim > 256 or cfg.v_head_dim > 1024:
        return False
    if cfg.mhc_lanes > 16 or cfg.qk_head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
        return False
    if not any(layer is not None for layer in weights.layers):
        return False
    for layer in weights.layers:
        if layer is None:
            continue
        products = (layer.qkvg, layer.out_proj, layer.mhc.phi)
        if not all(isinstance(p, list) and p and isinstance(p[0], ExactMatrix) for p in products):
            return False
        if layer.mlp.cond_v.shape[1] != 8:  # np_hadamard_mlp's conditioning rank
            return False
    return True


class NativePlan:
    """A deploy model's weights as `np_v3_model` (module doc)."""

    def __init__(self, cfg: V3Config, weights: V3Weights, plan: StepPlan, threads: int) -> None:
        keep: list = []
        self.keep = keep
        self.lanes, self.d = cfg.mhc_lanes, cfg.d_model
        layers = (native.V3Layer * max(1, len(weights.layers)))()
        for index, layer in enumerate(weights.layers):
            if layer is None:
                continue
            mhc, mlp, lp = layer.mhc, layer.mlp, plan.layers[index]
            vec = [np.ascontiguousarray(a, F32) for a in (mlp.d1, mlp.d2, mlp.b2, mlp.d3, mlp.d4)]
            mats = [np.ascontiguousarray(a, F32) for pair in mlp.stages for a in pair]
            keep.extend(vec + mats)
            c_vec = (ctypes.c_void_p * 5)(*[a.ctypes.data for a in vec])
            c_mats = (ctypes.c_void_p * 6)(*[a.ctypes.data for a in mats])
            keep.extend([c_vec, c_mats])
            taps = layer.qkv_taps
            entry = layers[index]
            entry.phi, entry.qkvg = _product(mhc.phi, keep), _product(layer.qkvg, keep)
            entry.out_proj = _product(layer.out_proj, keep)
            for name, value in (("b_pre", mhc.b_pre), ("b_post", mhc.b_post),
                                ("pre_offset", mhc.pre_offset), ("post_offset", mhc.post_offset),
                                ("b_res", mhc.b_res), ("norm_in", layer.norm_in),
                                ("qk_scale", lp.qk_scale), ("post_norm", layer.post_norm),
                                ("pre_hada", layer.pre_hada), ("cond_v", mlp.cond_v),
                                ("cond_u", mlp.cond_u)):
                setattr(entry, name, _f32(value, keep))
            entry.taps = _f32(taps, keep) if taps is not None else None
            entry.n_taps = 0 if taps is None else taps.shape[0]
            entry.mlp_vec, entry.mlp_mats = ctypes.addressof(c_vec), ctypes.addressof(c_mats)
            entry.engram_site = -1 if layer.engram_site is None else layer.engram_site
            entry.a_pre, entry.a_post, entry.a_res = mhc.a_pre, mhc.a_post, mhc.a_res
            entry.attn_gate = layer.attn_gate
        keep.append(layers)
        p1 = np.ascontiguousarray(weights.hada_p1, np.int64)
        p2 = np.ascontiguousarray(weights.hada_p2, np.int64)
        keep.extend([p1, p2])
        first = next((layer for layer in weights.layers if layer is not None), None)
        ba = first.mlp.stages[0][0].shape[0] if first is not None else 1
        lm_head = weights.lm_head
        self.vocab_out = 0
        head = native.V3Product()
        if isinstance(lm_head, list) and lm_head and isinstance(lm_head[0], ExactMatrix):
            head = _product(lm_head, keep)
            self.vocab_out = head.out
        self.model = native.V3Model(
            cfg.d_model, cfg.mhc_lanes, cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim,
            cfg.v_head_dim, cfg.hada_n, ba, cfg.max_seq_len, max(1, int(threads)),
            ctypes.addressof(layers), p1.ctypes.data, p2.ctypes.data,
            _f32(plan.rope_cos, keep), _f32(plan.rope_sin, keep),
            _f32(weights.final_norm, keep) if weights.final_norm is not None else None, head,
        )
        self.sites = 0
        self.native_engram = self._sites(cfg, weights, plan, keep)
        self.native_embed = self._embedding(weights, keep)
        self.layers = len(weights.layers)
        # whether `forward` runs the whole step as one call (`step`); benchmarks switch it off
        # to time the three calls it replaces
        self.whole_step = bool(self.native_engram and self.vocab_out)
        self.local = PerThread()
        self.address = ctypes.addressof(self.model)

    def _embedding(self, weights: V3Weights, keep: list) -> bool:
        """Point the model at the embedding's CQ rows for `step`'s gather; False (the caller
        passes the scaled rows) when the table is not 2- or 4-bit CQ rows of 128-groups."""
        table = weights.embedding_table
        if not (isinstance(table, CQTensor) and cq_type(table.bits).native_gather
                and table.group == GROUP and table.cols == self.d):
            return False
        codebook = np.zeros(16, F32)
        codebook[: table.codebook.size] = table.codebook
        packed = np.ascontiguousarray(table.packed)
        keep.extend([packed, codebook])
        self.model.emb_packed, self.model.emb_codebook = packed.ctypes.data, codebook.ctypes.data
        self.model.emb_norms = _f32(table.norms, keep)
        self.model.emb_row_bytes, self.model.emb_groups = packed.shape[1], table.norms.shape[1]
        self.model.emb_storage_bits = table.storage_bits
        return True

    def _sites(self, cfg: V3Config, weights: V3Weights, plan: StepPlan, keep: list) -> bool:
        """Fill the model's engram sites; False (Python engram path) when a site's tables are
        not 2- or 4-bit CQ rows of 128-groups or its product is not exact CQ."""
        sites = weights.engram
        if not sites:
            return True
        c_sites = (native.V3Site * len(sites))()
        for entry, site in zip(c_sites, sites, strict=True):
            table, kv = site.tables, site.key_value
            if not (isinstance(table, CQTensor) and cq_type(table.bits).native_gather
                    and table.group == GROUP and isinstance(kv, list) and kv
                    and isinstance(kv[0], ExactMatrix)):
                return False
            codebook = np.zeros(16, F32)
            codebook[: table.codebook.size] = table.codebook
            packed = np.ascontiguousarray(table.packed)
            keep.extend([packed, codebook])
            entry.packed, entry.codebook = packed.ctypes.data, codebook.ctypes.data
            entry.norms = _f32(table.norms, keep)
            entry.row_bytes, entry.groups = packed.shape[1], table.norms.shape[1]
            entry.storage_bits, entry.cols = table.storage_bits, table.cols
            entry.key_value = _product(kv, keep)
            entry.taps = _f32(site.taps, keep)
            entry.n_taps, entry.dilation = site.taps.shape[0], cfg.engram_conv_dilation
        order = np.asarray([o for o, _ in plan.table_seeds], np.int64)
        seed = np.asarray([s for _, s in plan.table_seeds], np.int64)
        if len(order) != cfg.num_engram_tables:
            return False
        keep.extend([c_sites, order, seed])
        self.model.sites, self.model.n_sites = ctypes.addressof(c_sites), len(sites)
        self.model.tables, self.model.slots = cfg.num_engram_tables, cfg.engram_slots
        self.model.table_order, self.model.table_seed = order.ctypes.data, seed.ctypes.data
        self.model.h = H128
        self.sites = len(sites)
        self.keep_tokens = max(cfg.engram_orders, default=1) - 1
        return True

    def engram(self, parts: Sequence[tuple], rows: int) -> dict[int, tuple]:
        """Every engram site's key and tapped value [rows, d] for `parts` = (first row, rows,
        first position, session tokens so far [int64], the chunk's tokens, engram ring
        [sites, ring rows, d] float32): recorded in each ring (EngramHistory)."""
        hold, c_parts = [], []
        for row0, count, start, consumed, tokens, ring in parts:
            before = consumed[max(0, start - self.keep_tokens) : start]
            history = np.concatenate([before, tokens]).astype(np.int64)
            hold.append(history)
            c_parts.append(native.V3Part(row0, count, start, None, history.ctypes.data,
                                         len(before), ring.ctypes.data, ring.shape[1]))
        array = (native.V3Part * len(c_parts))(*c_parts)
        keys = np.empty((self.sites, rows, self.d), F32)
        values = np.empty((self.sites, rows, self.d), F32)
        _check(native.LIBRARY.np_v3_engram(self.address, array, len(c_parts), rows,
                                           keys.ctypes.data, values.ctypes.data))
        return {site: (keys[site], values[site]) for site in range(self.sites)}

    def blocks(
        self, first: int, last: int, lanes: np.ndarray,
        parts: Sequence[tuple[int, int, int, int]], sites: dict[int, tuple] | None,
        cells: np.ndarray | None = None, cells_offset: int = 1,
    ) -> None:
        """Blocks first .. last-1 of lanes [R, n, d] (float32, C-contiguous; in place) for
        `parts` = (first row, rows, first position, address of that session's cache-pointer
        array for these blocks); `sites`: engram site -> (keys [R, d], values [R, d]); the
        lane means after block l go to cells[:, l - first + cells_offset]."""
        lib = native.LIBRARY
        c_parts = (native.V3Part * len(parts))(*[native.V3Part(*part) for part in parts])
        count = max(sites) + 1 if sites else 1
        keys = (ctypes.c_void_p * count)()
        values = (ctypes.c_void_p * count)()
        hold = []
        for site, (key, value) in (sites or {}).items():
            key, value = np.ascontiguousarray(key, F32), np.ascontiguousarray(value, F32)
            hold.append((key, value))
            keys[site], values[site] = key.ctypes.data, value.ctypes.data
        status = lib.np_v3_blocks(
            self.address, first, last, lanes.ctypes.data, lanes.shape[0], c_parts, len(parts),
            keys, values, None if cells is None else cells.ctypes.data,
            0 if cells is None else cells.shape[1], cells_offset,
        )
        _check(status)

    def step(self, tokens: np.ndarray, x0: np.ndarray | None, parts: Sequence[tuple],
             cells: np.ndarray | None, out_rows: np.ndarray) -> np.ndarray:
        """Logits [len(out_rows), vocab_out] of rows `out_rows` after the whole forward of the
        stacked chunks (tokens int64 [R]); x0: the scaled embedding rows [R, d] when the plan
        does not gather them (`native_embed` False), else None; `parts` = (first row, rows,
        first position, the session's cache-pointer array (`cache_pointers`, every block),
        session tokens so far, the chunk's tokens, engram ring [sites, ring rows, d]); cells
        [R, L + 1, d] (or None) receives x0 and the lane mean after each block."""
        hold, c_parts = [], []
        for row0, count, start, caches, consumed, chunk, ring in parts:
            before = consumed[max(0, start - self.keep_tokens) : start] if self.sites else \
                consumed[:0]
            history = np.concatenate([before, chunk]).astype(np.int64)
            hold.append((history, caches))
            c_parts.append(native.V3Part(row0, count, start, ctypes.addressof(caches),
                                         history.ctypes.data,
                                         len(before), ring.ctypes.data if self.sites else None,
                                         ring.shape[1] if self.sites else 0))
        rows = len(tokens)
        tokens = np.ascontiguousarray(tokens, np.int64)
        out_rows = np.ascontiguousarray(out_rows, np.int64)
        out = np.empty((len(out_rows), self.vocab_out), F32)
        arena = self.scratch().address if rows <= ARENA_ROWS else None
        if x0 is not None:
            x0 = np.ascontiguousarray(x0, F32)
        _check(native.LIBRARY.np_v3_step(
            self.address, arena, self.layers, tokens.ctypes.data,
            None if x0 is None else x0.ctypes.data, rows,
            (native.V3Part * len(c_parts))(*c_parts), len(c_parts),
            None if cells is None else cells.ctypes.data, 0 if cells is None else cells.shape[1],
            out_rows.ctypes.data, len(out_rows), out.ctypes.data))
        return out

    def scratch(self) -> Scratch:
        """The calling thread's arena (made on its first call, freed with the thread)."""
        scratch = self.local.scratch
        if scratch is None:
            scratch = self.local.scratch = Scratch()
        return scratch

    def readout(self, lanes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Logits [len(rows), vocab_out] of rows `rows` of lanes [R, n, d]."""
        rows = np.ascontiguousarray(rows, np.int64)
        out = np.empty((len(rows), self.vocab_out), F32)
        _check(native.LIBRARY.np_v3_readout(self.address, lanes.ctypes.data, rows.ctypes.data,
                                            len(rows), out.ctypes.data))
        return out


class PerThread(threading.local):
    """Each thread's `Scratch` (None until its first `NativePlan.step`)."""

    def __init__(self) -> None:
        self.scratch: Scratch | None = None


class Scratch:
    """One thread's `np_arena`: the native step's scratch between calls, freed with it."""

    def __init__(self) -> None:
        self.arena = native.Arena()
        self.free = native.LIBRARY.np_arena_free
        self.address = ctypes.addressof(self.arena)

    def __del__(self) -> None:
        self.free(self.address)


def _check(status: int) -> None:
    if status == 1:
        raise NonFiniteActivationError(STATUS[1])
    if status:
        raise RuntimeError(STATUS.get(status, f"native step failed ({status})"))


def native_plan(model: Any) -> NativePlan | None:
    """The model's NativePlan (built on first use by its numerics), or None (module doc)."""
    return model.num.native_plan(model)


def cache_pointers(caches: Sequence[Int8LayerCache]) -> ctypes.Array:
    """A C array of the caches' `np_v3_cache` addresses (one per block)."""
    return (ctypes.c_void_p * len(caches))(*[cache.c_address for cache in caches])
