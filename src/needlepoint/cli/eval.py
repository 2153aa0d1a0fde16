"""`needlepoint eval MODEL data.jsonl`: exact-match accuracy, greedy, grammar on and off.

Progress goes to stderr: a live bar at a terminal; otherwise (a log file, CI) plain lines,
one per tenth of the examples and at least every `PLAIN_EVERY_S` seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .common import add_threads_argument

PLAIN_EVERY_S = 15.0

HELP = "exact-match accuracy of greedy tool calls on a JSONL of {query, tools, answers}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .cact or .gguf file, a Hugging Face model directory, "
                        "or smollm2")
    parser.add_argument("data", type=Path, help="JSONL, one {query, tools, answers} a line")
    parser.add_argument("--grammar", choices=("both", "on", "off"), default="both",
                        help="decode with the tool-call grammar, without, or both (default)")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--tool-choice", choices=("auto", "required"), default="auto",
                        help="auto: the model calls or answers as it chooses (default); "
                        "required: a call in every answer")
    parser.add_argument("--limit", type=int, default=None, help="only the first N examples")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads_argument(parser)
    parser.add_argument("--no-speculate", dest="speculate", action="store_false",
                        help="decode one forward pass per token (no drafts; same tokens)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table

    from ..api.evaluate import evaluate, load_examples
    from ..models.loader import load

    examples = load_examples(args.data)[: args.limit]
    modes = {"both": ("grammar", "free"), "on": ("grammar",), "off": ("free",)}[args.grammar]
    model = load(args.model, threads=args.threads)
    console = Console(stderr=True)
    terminal = sys.stderr.isatty()
    progress = Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=console,
                        disable=args.no_progress or args.json or not terminal)
    plain = PlainProgress(len(examples)) if not terminal and not args.no_progress else None
    tally = dict.fromkeys(modes, 0)
    with progress:
        task = progress.add_task("", total=len(examples))

        def advance(index: int, outcome: dict[str, bool]) -> None:
            for mode, right in outcome.items():
                tally[mode] += right
            shown = "  ".join(f"{m} {tally[m]}/{index + 1}" for m in modes)
            progress.update(task, advance=1, description=shown)
            if plain is not None:
                plain.update(index + 1, shown)

        scores = evaluate(model, examples, max_new_tokens=args.max_new_tokens, modes=modes,
                          on_example=advance, speculate=args.speculate,
                          require_call=args.tool_choice == "required")
    if args.json:
        print(json.dumps({mode: s.as_dict() for mode, s in scores.items()}, indent=2))
        return 0
    table = Table(title=f"{args.data.name}: greedy exact match ({len(examples)} examples)")
    for column in ("decoding", "exact", "accuracy", "by expected calls", "malformed",
                   "tokens/s"):
        table.add_column(column)
    for mode, score in scores.items():
        splits = ", ".join(f"{n}: {c}/{t}" for n, (c, t) in sorted(score.by_calls.items()))
        rate = score.decode_tokens / score.seconds if score.seconds else 0.0
        table.add_row("grammar on" if mode == "grammar" else "grammar off",
                      f"{score.correct}/{score.total}", f"{100 * score.accuracy:.1f}%",
                      splits, str(score.malformed), f"{rate:.0f}")
    Console().print(table)
    return 0


class PlainProgress:
    """Progress lines for a stderr that is not a terminal (no bar to redraw)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.every = max(1, total // 10)
        self.start = self.last = time.monotonic()

    def update(self, done: int, shown: str) -> None:
        now = time.monotonic()
        if done % self.every and done != self.total and now - self.last < PLAIN_EVERY_S:
            return
        self.last = now
        percent = 100 * done / self.total if self.total else 100.0
        print(f"eval: {done}/{self.total} ({percent:.0f}%)  {shown}  {now - self.start:.0f} s",
              file=sys.stderr, flush=True)
