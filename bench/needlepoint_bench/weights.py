"""Bytes of weights a decode step must read, from the archive directory.

A decode step multiplies one activation row by every matrix of the network, so it streams
every CQ matrix once, except the ones it only *gathers* rows from: the engram tables (a few
hashed rows per site) and the embedding (one row). The LM head is the embedding matrix
(tied), so the embedding is streamed in full anyway. The confidence head is not used while
decoding. Small FP16/FP32 parameters (norms, taps, Hadamard-MLP blocks, mHC scalars) are
read every step too; they are listed separately because the floor figure the issue asks for
counts CQ matrices only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _records(archive: Path) -> tuple[list[dict], dict, str]:
    """[{name, dtype, shape, nbytes, bits}], geometry, source."""
    try:
        from needlepoint import open_archive

        a = open_archive(archive)
        recs = [
            {
                "name": r.name,
                "dtype": r.dtype,
                "shape": list(r.shape),
                "nbytes": int(r.nbytes),
                "bits": int(r.bits),
            }
            for r in a.records
        ]
        cfg = a.config
        geo = {
            "vocab": cfg.vocab,
            "d_model": cfg.d_model,
            "engram_slots": cfg.engram_slots,
            "num_engram_tables": cfg.num_engram_tables,
            "num_layers": cfg.num_layers,
            "file_bytes": a.size,
        }
        return recs, geo, "needlepoint.open_archive(...).records"
    except Exception as exc:  # noqa: BLE001 - fall back to the fixture sidecar
        side = archive.with_suffix(".json")
        if not side.is_file():
            raise RuntimeError(f"cannot read the archive directory: {exc}") from exc
        meta = json.loads(side.read_text())
        names = {1: "fp16", 2: "fp32", 3: "cq", 4: "raw"}
        recs = [
            {
                "name": r["name"],
                "dtype": names.get(r["dtype"], str(r["dtype"]).lower()),
                "shape": list(r["shape"]),
                "nbytes": int(r["nbytes"]),
                "bits": int(r.get("bits", 0)),
            }
            for r in meta["directory"]
        ]
        c = meta["config"]
        geo = {
            "vocab": c["vocab_size"],
            "d_model": c["d_model"],
            "engram_slots": c["engram_slots"],
            "num_engram_tables": meta["header"].get("num_engram_tables"),
            "num_layers": c["num_layers"],
            "file_bytes": archive.stat().st_size,
        }
        return recs, geo, f"sidecar {side.name} (needlepoint reader unavailable: {exc})"


def decode_weight_bytes(archive: Path) -> dict:
    recs, geo, source = _records(archive)
    head = ("confidence_head.", "embedding_head.", "router_head.", "heads.")
    streamed = gathered_row = small = cq_total = 0
    per_kind: dict[str, int] = {}
    for r in recs:
        name, dtype, nb = r["name"], r["dtype"], r["nbytes"]
        if dtype == "cq":
            cq_total += nb
        if name.startswith(head) or name == "tokenizer":
            continue
        if dtype == "cq":
            if name.endswith(".tables"):
                rows = r["shape"][0]
                # one row per table per site is gathered for each new token
                gathered_row += geo["num_engram_tables"] * (nb // rows)
                continue
            if name == "embedding":
                gathered_row += nb // r["shape"][0]  # the input row (the LM head is counted below)
            streamed += nb
            kind = name.split(".")[-1] if "." in name else name
            per_kind[kind] = per_kind.get(kind, 0) + nb
        elif dtype in ("fp16", "fp32"):
            small += nb
    return {
        "source": source,
        "file_bytes": geo["file_bytes"],
        "cq_bytes_total": cq_total,
        "decode_cq_bytes": streamed,  # the floor basis: all CQ but engram tables, + LM head
        "decode_gathered_bytes": gathered_row,
        "decode_small_param_bytes": small,
        "decode_total_bytes": streamed + gathered_row + small,
        "decode_cq_bytes_by_matrix": dict(sorted(per_kind.items(), key=lambda kv: -kv[1])),
    }


def resident_array_bytes(model, max_depth: int = 8) -> dict:
    """Estimate of the weights a needlepoint model holds, by walking its attributes.

    Preferred: the model states it (`decode_weight_bytes` attribute or method). Otherwise
    every numpy array reachable from the model object is summed once (by data pointer);
    arrays on a path containing `table` (engram tables: gathered, not streamed),
    `confidence` or `tokenizer` are excluded from the per-token estimate, and so are the
    layout copies of the codes (`ExactPart.interleaved`, 2-bit interleaved and 4-bit blocked:
    a decode product reads them instead of the packed codes, the same bytes, so one of the two
    is counted).
    """
    declared = getattr(model, "decode_weight_bytes", None)
    if callable(declared):
        try:
            declared = declared()
        except Exception:  # noqa: BLE001
            declared = None
    seen_obj: set[int] = set()
    seen_ptr: set[tuple[int, int]] = set()
    total = excluded = 0
    biggest: list[tuple[int, str]] = []

    def visit(obj, path: str, depth: int) -> None:
        nonlocal total, excluded
        if depth > max_depth or id(obj) in seen_obj:
            return
        seen_obj.add(id(obj))
        if isinstance(obj, np.ndarray):
            key = (obj.__array_interface__["data"][0], obj.nbytes)
            if key in seen_ptr or obj.nbytes == 0:
                return
            seen_ptr.add(key)
            total += obj.nbytes
            low = path.lower()
            if any(word in low for word in ("table", "confidence", "tokenizer", "interleaved")):
                excluded += obj.nbytes
            biggest.append((obj.nbytes, f"{path} {obj.dtype} {list(obj.shape)}"))
            return
        if isinstance(obj, (str, bytes, int, float, bool, type(None), memoryview)):
            return
        if isinstance(obj, dict):
            for k, v in obj.items():
                visit(v, f"{path}[{k!r}]", depth + 1)
            return
        if isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                visit(v, f"{path}[{i}]", depth + 1)
            return
        attrs = getattr(obj, "__dict__", None)
        if attrs is None and hasattr(obj, "__slots__"):
            attrs = {s: getattr(obj, s, None) for s in obj.__slots__}
        if isinstance(attrs, dict) and type(obj).__module__.split(".")[0] in ("needlepoint",):
            for k, v in attrs.items():
                visit(v, f"{path}.{k}", depth + 1)

    visit(model, "model", 0)
    biggest.sort(reverse=True)
    return {
        "declared_decode_weight_bytes": int(declared)
        if isinstance(declared, (int, np.integer))
        else None,
        "resident_array_bytes": total,
        "resident_excluded_bytes": excluded,
        "estimated_decode_weight_bytes": total - excluded,
        "largest_arrays": [f"{nb} {what}" for nb, what in biggest[:12]],
    }
