"""`needlepoint chat`: an interactive multi-turn conversation, one user turn per line.

The first line is shown with the tools; later lines continue the same session (its cache is
reused). `/reset` starts over, `/exit` (or end of input) quits. Stdout carries only answers
(with `--json`, one JSON object a line); notes such as "(conversation reset)" go to stderr.
At a terminal, lines are read with the stdlib `readline` (arrow keys, history, Ctrl-A/E) and
a hint names the commands. A line that is not UTF-8 is skipped with a message, not the end
of the session; when the conversation outgrows the context the oldest turns are dropped (and
the chat says so); an error in one turn is reported and the chat goes on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import NeedlepointError
from .common import (
    add_model_arguments,
    build_needle,
    notice,
    print_events,
    print_result,
    refuses_without_tools,
    turn_options,
)

HELP = "interactive multi-turn chat with tool calls (reads one user turn per line of stdin)"
HINT = "type a request and press Enter; /reset starts a new conversation, /exit quits"
PROMPT = "> "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)


def _terminal_lines() -> Iterator[str | None]:
    """Lines typed at a terminal, edited with readline; None for an undecodable line."""
    try:
        import readline  # noqa: F401 - importing it gives input() line editing and history
    except ImportError:  # pragma: no cover - no readline on this platform
        pass
    while True:
        try:
            yield input(PROMPT)
        except EOFError:
            print(file=sys.stderr)
            return
        except UnicodeDecodeError:
            yield None


def _piped_lines() -> Iterator[str | None]:
    """Lines of piped stdin, decoded one at a time (None for a line that is not UTF-8)."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream (tests): already decoded
        yield from iter(sys.stdin.readline, "")
        return
    for line in iter(raw.readline, b""):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            yield None


def run(args: argparse.Namespace) -> int:
    with build_needle(args) as needle:  # stops the MCP servers it started
        return _chat(needle, args)


def _chat(needle: Any, args: argparse.Namespace) -> int:
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"needlepoint chat: {HINT}", file=sys.stderr, flush=True)
    if not needle.tools and refuses_without_tools(needle):
        notice("no tools given (--tools FILE), so there is nothing to call: every answer is "
               "an immediate refusal")
    for number, line in enumerate(_terminal_lines() if interactive else _piped_lines(), 1):
        if line is None:
            print(f"(line {number} is not valid UTF-8 text; skipped)", file=sys.stderr,
                  flush=True)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            needle.reset()
            print("(conversation reset)", file=sys.stderr, flush=True)
            continue
        if text.startswith("/") and " " not in text:
            print(f"(unknown command {text}; {HINT})", file=sys.stderr, flush=True)
            continue
        try:
            envelope = print_events(needle.chat_stream(text, **turn_options(args)), args)
            if needle.mcp is not None and not args.no_execute and envelope.get("type") == "call":
                # MCP calls run on their servers; the results go back as the next turn
                results = [needle.execute(call) for call in envelope["function_calls"]]
                feedback = [{k: v for k, v in r.items() if k not in ("arguments", "server")}
                            for r in results]
                print_result({**needle.send_tool_results(feedback), "results": results}, args)
        except NeedlepointError as error:
            print(f"needlepoint: error: {' '.join(str(error).split())}", file=sys.stderr)
            needle.reset()
            print("(conversation reset)", file=sys.stderr, flush=True)
            continue
        dropped = envelope.get("dropped_turns")
        if dropped:
            print(f"(context full: dropped the oldest {dropped} turn"
                  f"{'s' if dropped != 1 else ''} to make room)", file=sys.stderr, flush=True)
    return 0
