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
from dataclasses import dataclass

import numpy as np

from ..cact import CQTensor
from ..kernels.cq import dequantize_rows, gather_rows
from ..ops import engram_slots, sigmoid
from .config import V3Config
from .fastnum import a8_rows
from .norms import rms_unit
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


def _gather(sites: tuple[EngramSite, ...], rows: np.ndarray) -> list[np.ndarray]:
    """Dequantised table rows [len(rows), sub] of every site: one batched gather for CQ
    tables (`gather_rows`, the same floats as `dequantize_rows` per site)."""
    tables = [site.tables for site in sites]
    if tables and all(isinstance(table, CQTensor) for table in tables):
        return list(gather_rows(tables, rows))
    return [
        table[rows].astype(F32) if isinstance(table, np.ndarray) else dequantize_rows(table, rows)
        for table in tables
    ]


def engram_chunk(
    cfg: V3Config,
    sites: tuple[EngramSite, ...],
    tokens: np.ndarray,
    start: int,
    tail: EngramTail,
    quantized: bool,
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], EngramTail]:
    """Indices [C, tables], keys and tapped values (one [C, d] per site) for positions
    `start .. start+C-1`, plus the tail for the next chunk."""
    count = len(tokens)
    d, tables, slots = cfg.d_model, cfg.num_engram_tables, cfg.engram_slots
    idx = engram_indices(cfg, tokens, tail)
    orders = np.repeat(np.asarray(cfg.engram_orders), cfg.engram_heads)  # order of each table
    # rows of tables whose n-gram reaches before position 0 are zero (only at the start)
    valid = None
    if start < int(orders.max(initial=1)) - 1:
        positions = np.arange(start, start + count)
        valid = positions[:, None] >= (orders[None, :] - 1)  # [C, tables]
    rows = (idx + np.arange(tables)[None, :] * slots).reshape(-1)
    keys, values = [], []
    new_values = tail.values.copy()
    taps_count, dilation = cfg.engram_conv_taps, cfg.engram_conv_dilation
    reach = tail.values.shape[1]
    for site_index, (site, lookup) in enumerate(zip(sites, _gather(sites, rows), strict=True)):
        lookup = lookup.reshape(count, tables, -1)
        if valid is not None:
            lookup *= valid[:, :, None]
        lookup = lookup.reshape(count, -1)
        if quantized:
            lookup = a8_rows(lookup)
        projected = lookup @ site.key_value
        keys.append(projected[:, :d])
        raw = projected[:, d:]
        history = np.concatenate([tail.values[site_index], raw])  # [reach + C, d]
        tapped = site.taps[0] * raw
        term = np.empty_like(tapped)
        for tap in range(1, taps_count):
            back = tap * dilation
            tapped += np.multiply(site.taps[tap], history[reach - back : reach - back + count],
                                  out=term)
        values.append(tapped)
        if reach:
            new_values[site_index] = history[-reach:]
    keep = max(cfg.engram_orders, default=1) - 1
    new_tokens = np.concatenate([tail.tokens, tokens])[-keep:] if keep else tail.tokens[:0]
    return idx, keys, values, EngramTail(new_tokens.astype(np.int64), new_values)


def engram_gate(u: np.ndarray, key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """`u + sigmoid(rms_unit(u) . rms_unit(k) / sqrt(d)) v'` per position (README `B(u)`)."""
    width = u.shape[-1]
    affinity = np.sum(rms_unit(u) * rms_unit(key), axis=-1, keepdims=True)
    return u + sigmoid(affinity / F32(math.sqrt(width))) * value
