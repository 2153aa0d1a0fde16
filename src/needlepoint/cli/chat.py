"""`needlepoint chat`: an interactive multi-turn conversation, one user turn per stdin line.

The first line is shown with the tools; later lines continue the same session (its cache is
reused). `/reset` starts over, `/exit` (or end of input) quits.
"""

from __future__ import annotations

import argparse
import sys

from .common import add_model_arguments, build_needle, print_events

HELP = "interactive multi-turn chat with tool calls (reads one user turn per line of stdin)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    needle = build_needle(args)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            needle.reset()
            print("(conversation reset)", flush=True)
            continue
        print_events(needle.chat_stream(text), args)
    return 0
