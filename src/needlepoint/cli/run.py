"""`needlepoint run "query" --tools tools.json`: one tool-calling turn.

The query is the argument, or read whole: `-` reads it from stdin, `--query-file PATH` (or
`@PATH`, when PATH is a file) from a file, so a query of any size never meets the shell's
argument-length limit. It must be UTF-8 and not blank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InvalidQueryError
from .common import (
    add_model_arguments,
    build_needle,
    decode_utf8,
    notice,
    print_events,
    print_result,
    refuses_without_tools,
    turn_options,
)

HELP = "answer one query with tool calls (pretty output, or --json for the raw envelope)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", nargs="?", help="the user's request; '-' reads it from stdin, "
                        "'@PATH' from a file")
    parser.add_argument("--query-file", type=Path, metavar="PATH",
                        help="read the query from a file (UTF-8)")
    parser.add_argument("--raw", action="store_true",
                        help="continue the text as it is (no chat template, no tools), "
                        "streaming: for base models")
    add_model_arguments(parser)


def read_query(args: argparse.Namespace) -> str:
    """The query text from the argument, stdin or a file."""
    if args.query is not None and args.query_file is not None:
        raise InvalidQueryError("give the query once: as an argument or with --query-file")
    if args.query_file is not None:
        return decode_utf8(args.query_file.read_bytes(), str(args.query_file))
    if args.query is None:
        raise InvalidQueryError("no query: pass it as an argument, '-' to read stdin, or "
                                "--query-file PATH")
    if args.query == "-":
        raw = getattr(sys.stdin, "buffer", None)
        return sys.stdin.read() if raw is None else decode_utf8(raw.read(), "stdin")
    if args.query.startswith("@") and Path(args.query[1:]).is_file():
        return decode_utf8(Path(args.query[1:]).read_bytes(), args.query[1:])
    return args.query


def run(args: argparse.Namespace) -> int:
    from ..api.needle import check_query

    query = check_query(read_query(args)).strip()  # before the model loads
    if args.raw:
        return raw(query, args)
    needle = build_needle(args)
    if not needle.tools and refuses_without_tools(needle):
        notice("no tools given (--tools FILE), so there is nothing to call: the answer is "
               "an immediate refusal")
    with needle:  # stops the MCP servers it started
        if needle.mcp is not None and not args.no_execute:
            # the agent loop: each chosen call runs on its MCP server (api/agent.py)
            print_result(needle.run(query, **turn_options(args)), args)
        else:
            print_events(needle.stream(query, **turn_options(args)), args)
    return 0


def raw(text: str, args: argparse.Namespace) -> int:
    """`--raw`: the model's plain continuation of `text`, streamed to stdout."""
    from ..generation.complete import continue_text
    from ..generation.sampling import SamplingConfig
    from ..models.hub import load_model, resolve_model_path

    if args.tools is not None or getattr(args, "mcp", None) is not None:
        raise InvalidQueryError("--raw continues plain text: it takes no --tools or --mcp")
    model = load_model(resolve_model_path(args.model), threads=getattr(args, "threads", None))
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed)
    sys.stdout.write(text)
    for piece in continue_text(model, text, max_new_tokens=args.max_new_tokens,
                               sampling=sampling):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
