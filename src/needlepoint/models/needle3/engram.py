"""Engram n-gram memory, batched over a chunk of positions (fixture README step 2).

Table `oi*heads + h` (order index oi, order o, hash head h) hashes the last o tokens with
seed index `oi*stride + h + 1` (`ops.engram_slots`); its row is zero while `t < o-1`. The
tables' rows are concatenated (A8 in deploy), projected to a key and a value, and the value is
mixed causally over dilated taps: `v'_t = sum_{j<taps} taps[j] v_{t - j*dil}`.

Rows are gathered from the CQ tables on demand (`dequantize_rows`): the tables are never
dequantised whole. A chunk continues a sequence through `EngramTail`: the last `max(order)-1`
tokens and the last `(taps-1)*dil` raw values of each site.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...formats.needle3_geometry import V3Config
from ...kernels.cq import dequantize_rows, gather_rows
from ...kernels.cq_tensor import CQTensor
from ..ops import engram_slots, rms_unit
from .weights import EngramSite

F32 = np.float32


@dataclass
class EngramTail:
    """What the next chunk needs from the positions before it (copied on fork)."""

    tokens: np.ndarray  # int64 [<= max_order - 1], oldest first
    values: np.ndarray  # [sites, reach, d] raw value projections, oldest first (zeros = before 0)

    def copy(self) -> EngramTail:
        return EngramTail(self.tokens.copy(), self.values.copy())


def new_tail(cfg: V3Config, sites: int) -> EngramTail:
    reach = max(0, cfg.engram_conv_taps - 1) * cfg.engram_conv_dilation
    return EngramTail(np.zeros(0, np.int64), np.zeros((sites, reach, cfg.d_model), F32))


def engram_indices(cfg: V3Config, tokens: np.ndarray, tail: EngramTail) -> np.ndarray:
    """Slot index [C, tables] of each chunk position (table = order_index*heads + head)."""
    heads = cfg.engram_heads
    stride = cfg.engram_seed_heads or heads
    history = np.concatenate([tail.tokens, tokens])
    known = len(tail.tokens)
    columns = []
    for order_index, order in enumerate(cfg.engram_orders):
        for head in range(heads):
            slots = engram_slots(history, order, order_index * stride + head + 1, cfg.engram_slots)
            columns.append(slots[known:])
    return np.stack(columns, axis=1)


def _site_rows(site: EngramSite, rows: np.ndarray) -> np.ndarray:
    """Dequantised table rows [len(rows), sub] of one site (`gather_rows` for a CQ table: the
    same floats as `dequantize_rows`, and as a gather batched over several sites)."""
    table = site.tables
    if isinstance(table, CQTensor):
        return gather_rows([table], rows)[0]
    if isinstance(table, np.ndarray):
        return table[rows].astype(F32)
    return dequantize_rows(table, rows)


class EngramChunk:
    """The engram lookups of a chunk of positions `start .. start+C-1`: indices [C, tables] up
    front, each site's key and tapped value [C, d] when its block asks (`site`). Projecting
    site by site keeps one site's pair alive instead of all of them (the sites' tables are
    gathered per site: each row's floats are the same as a gather of all sites at once).

    `tail` is the state for the next chunk; its values are complete once every site has been
    asked for (the forward asks for each site exactly once, in block order). `product` is
    the numerics' product (`numerics.py`: BLAS, or the exact A8 product in deploy)."""

    def __init__(
        self,
        cfg: V3Config,
        sites: tuple[EngramSite, ...],
        tokens: np.ndarray,
        start: int,
        tail: EngramTail,
        product: Callable[[np.ndarray, object], np.ndarray],
        keep: bool = False,
    ) -> None:
        self.cfg, self.sites, self.product = cfg, sites, product
        self.count = count = len(tokens)
        tables, slots = cfg.num_engram_tables, cfg.engram_slots
        self.idx = engram_indices(cfg, tokens, tail)
        orders = np.repeat(np.asarray(cfg.engram_orders), cfg.engram_heads)  # per table
        # rows of tables whose n-gram reaches before position 0 are zero (only at the start)
        self.valid = None
        if start < int(orders.max(initial=1)) - 1:
            positions = np.arange(start, start + count)
            self.valid = positions[:, None] >= (orders[None, :] - 1)  # [C, tables]
        self.rows = (self.idx + np.arange(tables)[None, :] * slots).reshape(-1)
        self.old_values = tail.values
        keep_tokens = max(cfg.engram_orders, default=1) - 1
        history = np.concatenate([tail.tokens, tokens])
        new_tokens = history[-keep_tokens:] if keep_tokens else tail.tokens[:0]
        self.tail = EngramTail(new_tokens.astype(np.int64), tail.values.copy())
        self.raw_values: dict[int, np.ndarray] = {}  # per site: value projections of the chunk
        # with `keep` (tracing), every site's key / value is kept for the trace
        self.keys: list[np.ndarray] | None = [] if keep else None
        self.values: list[np.ndarray] | None = [] if keep else None

    def site(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Key [C, d] and tapped value [C, d] of site `index`; records its tail values."""
        cfg, site, count = self.cfg, self.sites[index], self.count
        d = cfg.d_model
        lookup = _site_rows(site, self.rows).reshape(count, cfg.num_engram_tables, -1)
        if self.valid is not None:
            lookup *= self.valid[:, :, None]
        lookup = lookup.reshape(count, -1)
        projected = self.product(lookup, site.key_value)  # deploy: the exact A8 product
        del lookup
        key = projected[:, :d]
        raw = projected[:, d:]
        self.raw_values[index] = raw
        old = self.old_values[index]
        reach = old.shape[0]
        history = np.concatenate([old, raw])  # [reach + C, d]
        tapped = site.taps[0] * raw
        term = np.empty_like(tapped)
        for tap in range(1, cfg.engram_conv_taps):
            back = tap * cfg.engram_conv_dilation
            tapped += np.multiply(site.taps[tap], history[reach - back : reach - back + count],
                                  out=term)
        if reach:
            self.tail.values[index] = history[-reach:]
        if self.keys is not None and self.values is not None:
            self.keys.append(key)
            self.values.append(tapped)
        return key, tapped


def engram_gate(
    u: np.ndarray, key: np.ndarray, value: np.ndarray,
    sigmoid: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """`u + sigmoid(rms_unit(u) . rms_unit(k) / sqrt(d)) v'` per position (README `B(u)`),
    with the numerics' sigmoid."""
    width = u.shape[-1]
    affinity = np.add.reduce(rms_unit(u) * rms_unit(key), axis=-1, keepdims=True)
    return u + sigmoid(affinity / F32(math.sqrt(width))) * value
