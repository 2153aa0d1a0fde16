"""Shared pieces of the benchmark report: engine labels and colours, number formatting,
lookups into a results JSON, and the markdown table builder."""

from __future__ import annotations

from .engines import NEEDLE_RS, NP_DEPLOY, NP_FLOAT, cached
from .tables import markdown_table

LABEL = {NEEDLE_RS: "needle-rs", NP_DEPLOY: "needlepoint (deploy)", NP_FLOAT: "needlepoint (float)"}
LABEL.update(
    {cached(e): f"{LABEL[e][:-1]}, weight cache present)" for e in (NP_DEPLOY, NP_FLOAT)}
)
QUICK_NOTE = " (quick smoke run: few reps, short prompts)"
COLOR = {NEEDLE_RS: "tab:orange", NP_DEPLOY: "tab:blue", NP_FLOAT: "tab:green"}


# ----------------------------------------------------------------------------- helpers
def _num(x, digits: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, dict):
        x = x.get("median")
        if x is None:
            return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _range(d: dict | None, digits: int = 1) -> str:
    if not d or d.get("n", 0) == 0:
        return "—"
    return f"{_num(d['median'], digits)} [{_num(d['min'], digits)}–{_num(d['max'], digits)}]"


def _ratio(x) -> str:
    return "—" if x is None else f"{x:.2f}×"


def _mib(b) -> str:
    return "—" if b is None else f"{b / 2**20:.1f} MiB"


def _mb(b) -> str:
    return "—" if b is None else f"{b / 1e6:.2f} MB"


def _tsum(results: dict, threads: int) -> dict:
    return results.get("timing", {}).get("summary", {}).get(str(threads), {})


def _prompt_len(results: dict, name: str) -> int | None:
    for p in results.get("prompts", []):
        if p["name"] == name:
            return p["length"]
    return None


def _with_cached(engines: list[str]) -> list[str]:
    """Engines, each needlepoint one followed by its weight-cache-present variant."""
    return [x for e in engines for x in ((e,) if e == NEEDLE_RS else (e, cached(e)))]


def _unavailable(results: dict) -> dict:
    """engine -> first error seen anywhere, for engines that never ran."""
    out = {}
    for e in results.get("engines", []):
        ran = any(
            _tsum(results, t).get(e, {}).get("workloads") for t in results["config"]["threads"]
        )
        if ran:
            continue
        err = None
        for t in results["config"]["threads"]:
            err = err or _tsum(results, t).get(e, {}).get("error")
        for r in results.get("load", {}).get("raw", {}).get(e, []):
            err = err or r.get("error") or r.get("job_error")
        out[e] = err or "did not run"
    return out


def _met(direction: str, target: float, ratio) -> str:
    if ratio is None:
        return "n/a"
    ok = ratio >= target if direction == "speed" else ratio <= target
    return "yes" if ok else "**no**"


def _target_text(direction: str, target: float) -> str:
    return f"≥ {target:g}×" if direction == "speed" else f"≤ {target:g}×"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(markdown_table(header, rows))
