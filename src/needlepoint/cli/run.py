"""`needlepoint run "query" --tools tools.json`: one tool-calling turn."""

from __future__ import annotations

import argparse

from .common import add_model_arguments, build_needle, print_events

HELP = "answer one query with tool calls (pretty output, or --json for the raw envelope)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", help="the user's request")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    needle = build_needle(args)
    print_events(needle.stream(args.query), args)
    return 0
