"""The confidence's calibration on BFCL answers (`bfcl_serve.py`'s results).

    python -m needlepoint_bench.bfcl_calibration bench/results/bfcl_real_live.json \
        bench/results/bfcl_real.json --plot docs/bfcl_reliability.png

Every needlepoint answer with a confidence is one point (confidence, right). The calibration
(`needlepoint.api.confidence.fit_calibration`, Platt scaling on the log-odds) is fitted on the
`live_*` answers only; on the held-out answers the area under the ROC curve of right-vs-wrong
(`auroc`) and the expected calibration error over 10 equal-width bins (`ece`) are reported
before (the raw evidence) and after (the fitted map). The live results' confidences must be
raw (their report's `calibration` is the identity); held-out results run with a calibration
are mapped back to raw evidence (`raw_of`).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BINS = 10


def auroc(scores: Sequence[float], right: Sequence[bool]) -> float | None:
    """P(a right answer's score > a wrong one's), ties counting one half (Mann-Whitney U);
    None when either class is empty."""
    pos = [s for s, r in zip(scores, right, strict=True) if r]
    neg = [s for s, r in zip(scores, right, strict=True) if not r]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def bin_of(score: float, bins: int = BINS) -> int:
    """Equal-width bin [k/bins, (k+1)/bins), the last one closed."""
    return min(int(score * bins), bins - 1)


def reliability(scores: Sequence[float], right: Sequence[bool],
                bins: int = BINS) -> list[dict[str, float]]:
    """Per non-empty bin: its number of answers, mean confidence and accuracy."""
    groups: dict[int, list[tuple[float, bool]]] = {}
    for s, r in zip(scores, right, strict=True):
        groups.setdefault(bin_of(s, bins), []).append((s, r))
    return [{"bin": k, "n": len(g), "confidence": sum(s for s, _ in g) / len(g),
             "accuracy": sum(r for _, r in g) / len(g)} for k, g in sorted(groups.items())]


def ece(scores: Sequence[float], right: Sequence[bool], bins: int = BINS) -> float | None:
    """Expected calibration error: sum over bins of (bin size / N) * |accuracy - confidence|."""
    if not scores:
        return None
    n = len(scores)
    return sum(b["n"] / n * abs(b["accuracy"] - b["confidence"])
               for b in reliability(scores, right, bins))


def points(report: dict[str, Any], engine: str = "needlepoint") -> list[dict[str, Any]]:
    """The rows of `engine` that carry a confidence."""
    return [r for r in report["rows"] if r["engine"] == engine and r["confidence"] is not None]


def raw_of(published: float, used: dict[str, float] | None) -> float:
    """The raw evidence behind a confidence published through the Platt map `used`
    (`sigmoid(slope * logit(raw) + offset)`, inverted; 0 and 1 are its own limits):
    held-out runs made with the shipped map are measured on raw evidence like the rest."""
    if used is None or (used["slope"], used["offset"]) == (1.0, 0.0) or \
            not 0.0 < published < 1.0:
        return published
    z = (math.log(published / (1.0 - published)) - used["offset"]) / used["slope"]
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def figures(rows: list[dict[str, Any]], calibration: Any) -> dict[str, Any]:
    """AUROC and ECE of rows' confidences, raw and through `calibration`."""
    raw = [float(r["confidence"]) for r in rows]
    right = [bool(r["right"]) for r in rows]
    fitted = [float(calibration(x)) for x in raw]
    return {"n": len(rows), "accuracy": sum(right) / len(rows) if rows else None,
            "mean_raw": sum(raw) / len(raw) if raw else None,
            "mean_calibrated": sum(fitted) / len(fitted) if fitted else None,
            "auroc": auroc(raw, right), "ece_raw": ece(raw, right),
            "ece_calibrated": ece(fitted, right),
            "reliability_raw": reliability(raw, right),
            "reliability_calibrated": reliability(fitted, right)}


def calibrate(live: dict[str, Any], held: dict[str, Any]) -> dict[str, Any]:
    """Fit on live, measure on live and held-out (overall, per mode, per category)."""
    from needlepoint import Calibration, fit_calibration

    used = live.get("calibration", {"slope": 1.0, "offset": 0.0})
    if (used["slope"], used["offset"]) != (1.0, 0.0):
        raise SystemExit(f"the live results were run with a calibration {used}: fit on raw "
                         "evidence (the identity)")
    fit_rows = points(live)
    fit = fit_calibration([r["confidence"] for r in fit_rows], [r["right"] for r in fit_rows])
    fitted = Calibration(round(fit.slope, 4), round(fit.offset, 4))
    held_rows = [{**r, "confidence": raw_of(r["confidence"], held.get("calibration"))}
                 for r in points(held)]
    out: dict[str, Any] = {"slope": fitted.slope, "offset": fitted.offset,
                           "live": figures(fit_rows, fitted),
                           "held_out": figures(held_rows, fitted), "held_out_by": {}}
    for key in ("mode", "category"):
        for value in sorted({r[key] for r in held_rows}):
            subset = [r for r in held_rows if r[key] == value]
            out["held_out_by"][f"{key}={value}"] = {
                k: v for k, v in figures(subset, fitted).items()
                if not k.startswith("reliability")}
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """The reliability diagram: accuracy against mean confidence per bin, live (fit) and
    held-out, raw and calibrated (marker area: the bin's answers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
    for ax, kind in zip(axes, ("raw", "calibrated"), strict=True):
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
        for name, colour in (("live", "tab:blue"), ("held_out", "tab:orange")):
            bins = result[name][f"reliability_{kind}"]
            ece_value = result[name][f"ece_{kind}"]
            label = (f"{'live_* (fit)' if name == 'live' else 'held-out'}: "
                     f"n={result[name]['n']}, ECE {ece_value:.3f}")
            ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], "-o",
                    color=colour, label=label, ms=3)
            ax.scatter([b["confidence"] for b in bins], [b["accuracy"] for b in bins],
                       s=[8 + 4 * b["n"] for b in bins], color=colour, alpha=0.3)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"confidence ({kind})")
        title = "raw evidence" if kind == "raw" else \
            f"calibrated: slope {result['slope']}, offset {result['offset']}"
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel("fraction of answers right (BFCL AST checker)")
    fig.suptitle("needlepoint decision confidence, Qwen2.5-Coder-0.5B-Instruct GGUF, "
                 "10 bins", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("live", type=Path, help="bfcl_serve results on live_* categories")
    parser.add_argument("held", type=Path, help="bfcl_serve results on held-out categories")
    parser.add_argument("--plot", type=Path, default=None, help="reliability diagram PNG")
    parser.add_argument("--out", type=Path, default=None, help="the figures as JSON")
    args = parser.parse_args(argv)
    result = calibrate(json.loads(args.live.read_text()), json.loads(args.held.read_text()))
    if args.plot is not None:
        plot(result, args.plot)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for name in ("live", "held_out"):
        f = result[name]
        print(f"{name}: n={f['n']} acc={f['accuracy']:.3f} AUROC={f['auroc']} "
              f"ECE raw={f['ece_raw']:.3f} calibrated={f['ece_calibrated']:.3f}")
    print(f"slope={result['slope']} offset={result['offset']}")
    for key, f in result["held_out_by"].items():
        print(f"  {key}: n={f['n']} AUROC={f['auroc']} ECE raw={f['ece_raw']:.3f} "
              f"cal={f['ece_calibrated']:.3f}")


if __name__ == "__main__":
    main()
