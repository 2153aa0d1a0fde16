"""Consistency checks for the `.cact` reader: header geometry (rejected before any size is
computed from it, so a flipped bit is a `CactFormatError`, never a huge allocation or a
hang) and blob sizes implied by dtype and shape (that blobs must not overlap is checked in
`cact_records`, beside the record type). Field offsets
follow the header tables of both fixture READMEs.
"""

from __future__ import annotations

import numpy as np

from ..errors import CactFormatError
from ..kernels.wtypes import cq_tensor_bytes, cq_type

RECORD_BYTES = 44
# Upper bound on any single header dimension: anything larger is corruption, and checking it
# up front keeps a flipped bit from turning into a huge allocation.
MAX_DIM = 1 << 24
# Byte offset of each header field (word index * 4), for error messages.
HEADER_OFFSETS = {
    3: dict(
        num_tensors=4, codebook_len=8, kv_window=12, kv_bits=16, vocab=20, out_vocab=24,
        d_model=28, num_heads=32, num_kv_heads=36, num_layers=40, qk_head_dim=44,
        v_head_dim=48, max_seq_len=52, hada_n=56, mhc_lanes=60, sliding_window=64,
        global_layers=68, qkv_conv_taps=76, engram_slots=80, engram_sub_dim=84,
        num_engram_tables=88, engram_conv_taps=92, engram_conv_dilation=96,
        engram_seed_heads=100, num_engram_orders=104, engram_orders=108,
        num_engram_sites=124, engram_sites=128, rope_theta=192,
    ),
    2: dict(
        num_tensors=4, codebook_len=8, kv_window=12, kv_bits=16, vocab=20, d_model=24,
        num_heads=28, num_kv_heads=32, num_layers=36, head_dim=40, max_seq_len=44, hada_n=48,
        mhc_lanes=52, engram_slots=56, engram_sub_dim=60, num_engram_tables=64,
        engram_conv_taps=68, engram_conv_dilation=72, num_engram_orders=76, engram_orders=80,
        num_engram_sites=96, engram_sites=100, rope_theta=116,
    ),
}


def header_error(field: str, offset: int, message: str) -> CactFormatError:
    return CactFormatError(f"{field} (byte offset {offset}): {message}")


def validate_header(values: dict, generation: int) -> None:
    """Reject geometry that cannot be a model before any size is computed from it."""
    offsets = HEADER_OFFSETS[generation]

    def fail(name: str, message: str) -> CactFormatError:
        return header_error(f"header.{name}", offsets[name], message)

    positive = ["vocab", "d_model", "num_heads", "num_kv_heads", "num_layers", "max_seq_len",
                "hada_n", "mhc_lanes"]
    positive += ["qk_head_dim", "v_head_dim"] if generation == 3 else ["head_dim"]
    for name in positive:
        value = values[name]
        if not 0 < value <= MAX_DIM:
            raise fail(name, f"implausible value {value}")
    if values["num_heads"] % values["num_kv_heads"]:
        raise fail("num_kv_heads", "num_heads is not a multiple of num_kv_heads")
    if generation == 3 and values["out_vocab"] > values["vocab"]:
        raise fail("out_vocab", f"out_vocab {values['out_vocab']} > vocab {values['vocab']}")
    if values["kv_bits"] > 32:  # 0 may mean "no KV quantisation": allowed
        raise fail("kv_bits", f"implausible KV width {values['kv_bits']}")
    hada_n = values["hada_n"]
    if hada_n & (hada_n - 1) or hada_n < values["d_model"]:
        raise fail("hada_n", f"hada_n {hada_n} is not a power of two >= d_model")
    n_orders, n_sites = values["_n_orders"], values["_n_sites"]
    if n_orders > 4:
        raise fail("num_engram_orders", f"{n_orders} n-gram orders (at most 4)")
    if n_sites > (16 if generation == 3 else 4):
        raise fail("num_engram_sites", f"{n_sites} engram sites is too many")
    if n_sites and n_orders == 0:
        raise fail("num_engram_orders", "engram sites without n-gram orders")
    sites = values["engram_sites"]
    if any(site >= values["num_layers"] for site in sites):
        raise fail("engram_sites", f"engram site beyond the last layer in {sites}")
    if any(a >= b for a, b in zip(sites, sites[1:], strict=False)):
        raise fail("engram_sites", f"engram sites {sites} are not strictly increasing")
    if n_sites:
        for name, low, high in (
            ("engram_slots", 1, MAX_DIM), ("engram_sub_dim", 1, MAX_DIM),
            ("num_engram_tables", 1, 64), ("engram_conv_taps", 1, 64),
            ("engram_conv_dilation", 1, 64),
        ):
            if not low <= values[name] <= high:
                raise fail(name, f"implausible engram geometry: {name} = {values[name]}")
        if any(not 1 <= order <= 64 for order in values["engram_orders"]):
            raise fail("engram_orders", f"implausible n-gram orders {values['engram_orders']}")
        if values["num_engram_tables"] % n_orders:
            raise fail(
                "num_engram_tables",
                f"{values['num_engram_tables']} tables is not a multiple of {n_orders} orders",
            )
        if generation == 3 and values["engram_seed_heads"] > 64:
            raise fail("engram_seed_heads", f"implausible value {values['engram_seed_heads']}")
    if not np.isfinite(values["rope_theta"]) or values["rope_theta"] <= 0:
        raise fail("rope_theta", f"invalid rope_theta {values['rope_theta']}")
    if generation == 3 and values["qkv_conv_taps"] > 64:
        raise fail("qkv_conv_taps", f"implausible tap count {values['qkv_conv_taps']}")


def cq_nbytes(rows: int, cols: int, bits: int, group: int) -> int:
    """Blob size of a CQ record: packed indices then FP16 norms (README "CQ tensors")."""
    return cq_tensor_bytes(cq_type(bits), rows, cols, group)


def expected_nbytes(dtype: str, shape: tuple[int, ...], group: int, bits: int) -> int | None:
    """Blob size the dtype and shape imply (None for RAW); CQ bits/group already checked."""
    count = 1
    for dim in shape:
        count *= dim  # Python ints: a corrupt shape cannot overflow
    if dtype == "fp16":
        return 2 * count
    if dtype == "fp32":
        return 4 * count
    if dtype == "raw":
        return None
    rows = shape[0]
    cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return cq_nbytes(rows, cols, bits, group)
