"""Engram memory: hashed n-gram rows, key/value projections and the dilated value
convolution (needle2 README "Forward pass" 2; seed 002 "Deriving the Engram window").

For order o (index oi) and hash head h the table is `t = oi*heads + h`, hashed with seed
index `t + 1`; the row is zero while `pos < o - 1`. Rows are gathered from the packed
table per position (never dequantised whole). The convolution reads the un-convolved
values of the last `(taps - 1) * dilation` positions, which the state keeps per site.
"""

from __future__ import annotations

import numpy as np

from ...formats.needle2_geometry import V2Config
from ...kernels.cq import dequantize_rows
from ..ops import engram_slots
from .state import V2State
from .weights import EngramWeights


def table_rows(history: np.ndarray, pos0: int, count: int, cfg: V2Config) -> np.ndarray:
    """Table rows `t*slots + slot` for positions pos0..pos0+count-1, [count, tables];
    -1 marks a row that is zero because the n-gram reaches before the sequence start."""
    orders = cfg.engram_orders
    start = max(0, pos0 - max(orders) + 1)
    tokens = history[start : pos0 + count]
    skip = pos0 - start
    positions = pos0 + np.arange(count)
    heads = cfg.engram_heads
    rows = np.empty((count, cfg.num_engram_tables), np.int64)
    for oi, order in enumerate(orders):
        for head in range(heads):
            table = oi * heads + head
            slot = engram_slots(tokens, order, table + 1, cfg.engram_slots)[skip:]
            rows[:, table] = np.where(positions >= order - 1, table * cfg.engram_slots + slot, -1)
    return rows


def engram_keys_values(
    engrams: tuple[EngramWeights, ...], cfg: V2Config, state: V2State, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and convolved values `[sites, T, C]` for the chunk's `count` new positions
    (their tokens already in `state.history`); advances each site's value tail."""
    c = cfg.d_model
    sites = len(engrams)
    keys = np.empty((sites, count, c), np.float32)
    values = np.empty((sites, count, c), np.float32)
    if not sites:
        return keys, values
    rows = table_rows(state.history, state.position, count, cfg).ravel()
    live = rows >= 0
    tail_len = state.engram_tail.shape[1]
    dilation = cfg.engram_conv_dilation
    for s, site in enumerate(engrams):
        fetched = np.zeros((rows.size, cfg.engram_sub_dim), np.float32)
        if live.any():
            fetched[live] = dequantize_rows(site.tables, rows[live])
        kv = fetched.reshape(count, -1) @ site.w_kv
        keys[s] = kv[:, :c]
        raw = np.concatenate([state.engram_tail[s], kv[:, c:]])  # [tail + T, C]
        conv = site.taps[0] * raw[tail_len:]
        for tap in range(1, site.taps.shape[0]):
            back = tap * dilation
            conv += site.taps[tap] * raw[tail_len - back : tail_len - back + count]
        values[s] = conv
        if tail_len:
            state.engram_tail[s] = raw[-tail_len:]
    return keys, values
