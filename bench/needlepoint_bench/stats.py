"""Summary statistics of a benchmark run: per-sample medians and spread, needlepoint /
needle-rs ratios (plain and paired), and decode time against the memory-bandwidth floor."""

from __future__ import annotations

import numpy as np

from .engines import NEEDLE_RS, NP_DEPLOY, NP_FLOAT, cached


def describe_samples(values: list[float]) -> dict:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    med = float(np.median(a))
    return {
        "n": int(a.size),
        "median": med,
        "min": float(a.min()),
        "max": float(a.max()),
        "p25": float(np.percentile(a, 25)),
        "p75": float(np.percentile(a, 75)),
        "spread_pct": float((a.max() - a.min()) / med * 100) if med else None,
    }


def summarise_timing(res: dict) -> dict:
    """Per engine and workload: seconds and tokens/s (per-sample rates, then median)."""
    out = {}
    for name, rec in res.get("engines", {}).items():
        e = {
            "available": rec.get("available", False),
            "error": rec.get("error"),
            "notes": rec.get("notes", []),
            "workloads": {},
        }
        for key, s in rec.get("samples", {}).items():
            rates = [t / sec for t, sec in zip(s["tokens"], s["seconds"], strict=True) if sec > 0]
            cpu = s.get("cpu_seconds", [])
            cpu_rates = [t / c for t, c in zip(s["tokens"], cpu, strict=False) if c > 0]
            e["workloads"][key] = {
                "seconds": describe_samples(s["seconds"]),
                "tok_s": describe_samples(rates),
                "cpu_seconds": describe_samples(cpu),
                "cpu_tok_s": describe_samples(cpu_rates),
                "tokens": describe_samples(s["tokens"]),
                "per_sample_tok_s": rates,
                "per_sample_cpu_tok_s": cpu_rates,
            }
        out[name] = e
    return out


def paired_ratio(num: list[float], den: list[float]) -> dict | None:
    """Per-repetition ratios of two interleaved sample lists (same rep index)."""
    k = min(len(num), len(den))
    if k == 0:
        return None
    r = [a / b for a, b in zip(num[:k], den[:k], strict=True) if b > 0]
    return {"median": float(np.median(r)), "min": float(min(r)), "max": float(max(r)), "n": len(r)}


def ratios(threads_results: dict, load: dict, rss: dict, floor: dict) -> dict:
    """needlepoint / needle-rs for each figure, per thread count and needlepoint numerics."""
    table: dict = {}
    for np_name in (NP_DEPLOY, NP_FLOAT):
        rows = {}
        for threads, summ in threads_results.items():
            rs, mine = summ.get(NEEDLE_RS, {}), summ.get(np_name, {})
            for key in sorted(set(rs.get("workloads", {})) | set(mine.get("workloads", {}))):
                a, b = mine.get("workloads", {}).get(key), rs.get("workloads", {}).get(key)
                fig = "decode" if key.startswith("decode:") else key
                ca, cb = (a or {}).get("cpu_tok_s", {}), (b or {}).get("cpu_tok_s", {})
                rows.setdefault(fig, {})[f"t{threads}"] = {
                    "ratio_cpu": ca["median"] / cb["median"]
                    if ca.get("n") and cb.get("n")
                    else None,
                    "needlepoint": a["tok_s"] if a else None,
                    "needle_rs": b["tok_s"] if b else None,
                    "ratio": (a["tok_s"]["median"] / b["tok_s"]["median"]) if a and b else None,
                    "paired": paired_ratio(a["per_sample_tok_s"], b["per_sample_tok_s"])
                    if a and b
                    else None,
                }
        lb, rb = load.get(NEEDLE_RS), rss.get(NEEDLE_RS, {})
        for fig, name in (("load", np_name), ("load_warm", cached(np_name))):
            la = load.get(name)
            rows[fig] = {
                "t1": {
                    "needlepoint": la["load_to_ready_s"] if la else None,
                    "needle_rs": lb["load_to_ready_s"] if lb else None,
                    "ratio": la["load_to_ready_s"]["median"] / lb["load_to_ready_s"]["median"]
                    if la and lb and lb["load_to_ready_s"]["median"] > 0
                    else None,
                }
            }
        for fig, name in (("peak_rss", np_name), ("peak_rss_warm", cached(np_name))):
            ra = rss.get(name, {})
            rows[fig] = {
                "t1": {
                    "needlepoint": ra.get("peak_rss_bytes"),
                    "needle_rs": rb.get("peak_rss_bytes"),
                    "ratio": ra["peak_rss_bytes"] / rb["peak_rss_bytes"]
                    if ra.get("available") and rb.get("available")
                    else None,
                }
            }
        bpt_np = engine_weight_bytes(np_name, rss, floor["weights"])
        bpt_rs = (
            engine_weight_bytes(NEEDLE_RS, rss, floor["weights"]) if rb.get("available") else None
        )
        rows["bytes_per_token"] = {
            "t1": {
                "needlepoint": bpt_np,
                "needle_rs": bpt_rs,
                "ratio": bpt_np / bpt_rs if bpt_np and bpt_rs else None,
            }
        }
        table[np_name] = rows
    return table


def floor_figures(weights: dict, timing: dict) -> dict:
    """Bandwidth floor: decode-weight bytes / measured read bandwidth, per thread count."""
    out = {"weights": weights, "per_threads": {}}
    for threads, res in timing.items():
        bws = [b for b in (res.get("bandwidth_before"), res.get("bandwidth_after")) if b]
        if not bws:
            continue
        dram = [x for b in bws for x in b["read_GBps"]["all"]]
        cache = [x for b in bws for x in b["read_cache_GBps"]["all"]]
        copy = [x for b in bws for x in b["copy_GBps"]["all"]]
        best_dram, med_dram = max(dram), float(np.median(dram))
        cq = weights["decode_cq_bytes"]
        out["per_threads"][f"t{threads}"] = {
            "read_GBps_median": med_dram,
            "read_GBps_best": best_dram,
            "copy_GBps_median": float(np.median(copy)),
            "cache_read_GBps_median": float(np.median(cache)),
            "cache_read_GBps_best": max(cache),
            "floor_decode_ms_dram": cq / (best_dram * 1e9) * 1e3,
            "floor_decode_ms_dram_median_bw": cq / (med_dram * 1e9) * 1e3,
            "floor_decode_ms_cache": cq / (max(cache) * 1e9) * 1e3,
            "floor_decode_tok_s_dram": best_dram * 1e9 / cq,
        }
    return out


def engine_weight_bytes(name: str, rss: dict, weights: dict) -> int | None:
    """Weight bytes one decode step of this engine reads (see `weights.py`)."""
    if name == NEEDLE_RS:
        return weights["decode_total_bytes"]  # runs from the packed archive
    w = rss.get(name, {}).get("weights") or {}
    return w.get("declared_decode_weight_bytes") or w.get("estimated_decode_weight_bytes")


def decode_vs_floor(threads_results: dict, floor: dict, rss: dict) -> dict:
    """Decode time per token as a multiple of the floor: the archive's packed decode bytes
    over the best measured read bandwidth (DRAM, and an L3-resident buffer); and the floor
    implied by the bytes the engine itself holds and reads per token."""
    out = {}
    for threads, summ in threads_results.items():
        f = floor["per_threads"].get(f"t{threads}")
        if not f:
            continue
        for name, e in summ.items():
            for key, w in e.get("workloads", {}).items():
                if key.startswith("decode:"):
                    ms = 1e3 / w["tok_s"]["median"]
                    own = engine_weight_bytes(name, rss, floor["weights"])
                    own_ms = own / (f["read_GBps_best"] * 1e9) * 1e3 if own else None
                    out.setdefault(name, {})[f"t{threads}"] = {
                        "decode_ms_per_token": ms,
                        "decode_ms_per_token_best": 1e3 / w["tok_s"]["max"],
                        "floor_ms_dram": f["floor_decode_ms_dram"],
                        "multiple_of_dram_floor": ms / f["floor_decode_ms_dram"],
                        "multiple_of_cache_floor": ms / f["floor_decode_ms_cache"],
                        "engine_weight_bytes": own,
                        "floor_ms_engine_bytes": own_ms,
                    }
    return out
