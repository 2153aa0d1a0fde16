"""Shared pieces of the `run` and `chat` subcommands: options, tools files, output."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InvalidQueryError, ToolSchemaError

TOOL_CHOICES = ("auto", "required", "none")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--tools/--model/--system and the generation options shared by `run` and `chat`."""
    parser.add_argument("--tools", type=Path, help="JSON file: a list of tool schemas "
                        '({"name", "description", "parameters"} or OpenAI form)')
    parser.add_argument("--model", help="a .cact or .gguf file, a Hugging Face model directory, or "
                        "smollm2 (default: $NEEDLEPOINT_MODEL, else the bundled demo model)")
    parser.add_argument("--mcp", type=Path, metavar="MCP_JSON",
                        help='MCP servers whose tools to offer: an mcp.json ({"mcpServers": '
                        '...}, docs/api.md "MCP servers as tools")')
    parser.add_argument("--no-execute", action="store_true",
                        help="with --mcp: only print the chosen calls, do not run them")
    parser.add_argument("--system", help="system facts, e.g. 'locale: en-US'")
    parser.add_argument("--auto-date", action="store_true", help="add a 'date:' system fact")
    parser.add_argument("--json", action="store_true", help="print the raw envelope as JSON")
    parser.add_argument("--stream", action="store_true", help="print tokens as they decode")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--reasoning-budget", type=int, default=256,
                        help="free tokens before the tool call is forced")
    parser.add_argument("--no-grammar", action="store_true",
                        help="do not constrain tool calls to the schemas")
    parser.add_argument("--no-speculate", action="store_true",
                        help="decode one forward pass per token (no drafts; same tokens)")
    add_tool_format_argument(parser)
    from ..stages.options import add_stage_arguments

    add_stage_arguments(parser)  # --stages, --ray, --placement (docs/distributed.md)
    add_threads_argument(parser)


def add_tool_format_argument(parser: argparse.ArgumentParser) -> None:
    """--tool-format and --chat-template-kwargs of run and chat (`Needle(tool_format=...,
    template_kwargs=...)`); --tool-choice (OpenAI's, for one turn)."""
    from ..generation.syntaxes import tool_formats

    parser.add_argument("--tool-format", choices=tool_formats(), default=None,
                        help="a chat-template model's tool-call syntax (default auto: the one "
                        "its chat template uses)")
    parser.add_argument("--chat-template-kwargs", type=template_kwargs_argument, default=None,
                        metavar="JSON", help="variables for a chat-template model's template, "
                        """e.g. '{"enable_thinking": false}' (Qwen3)""")
    parser.add_argument("--tool-choice", choices=TOOL_CHOICES, default="auto",
                        help="auto: call or answer (default); required: a call; none: text")


def template_kwargs_argument(text: str) -> dict[str, Any]:
    """argparse's view of `chat_format.parse_template_kwargs`."""
    from ..formats.chat_format import parse_template_kwargs

    try:
        return parse_template_kwargs(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def turn_options(args: argparse.Namespace) -> dict[str, Any]:
    """Per-turn options of --tool-choice (`Needle.stream` / `chat_stream`)."""
    choice = getattr(args, "tool_choice", "auto")
    return {"required": {"require_call": True}, "none": {"allow_call": False}}.get(choice, {})


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads, shared by run, chat, eval and serve (`needlepoint.load(threads=...)`)."""
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="CPU threads for the model (default: $NEEDLEPOINT_THREADS, else 1)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def load_tools(path: Path | None) -> list[Any]:
    """The tool list of a JSON file (a list, or an object with a "tools" list)."""
    if path is None:
        return []
    try:
        data = json.loads(decode_utf8(path.read_bytes(), str(path)))
    except InvalidQueryError as error:
        raise ToolSchemaError(str(error)) from None
    except json.JSONDecodeError as error:
        raise ToolSchemaError(f"{path}: not valid JSON ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list):
        raise ToolSchemaError(f"{path}: expected a JSON list of tools")
    return data


def decode_utf8(data: bytes, where: str) -> str:
    """`data` as text, or one clear error naming `where` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = data[error.start : error.start + 1].hex()
        raise InvalidQueryError(f"{where}: not UTF-8 text (byte 0x{bad} at offset "
                                f"{error.start}); save it as UTF-8") from None


def notice(message: str) -> None:
    """One line for the user on stderr, before any model work."""
    print(f"needlepoint: note: {message}", file=sys.stderr, flush=True)


def refuses_without_tools(needle: Any) -> bool:
    """Whether a turn without tools is an immediate refusal: Needle's wire format (its
    `<tool_call>[]</tool_call>`), not a chat-template model, which answers in text."""
    return not needle.whole_answer


def build_needle(args: argparse.Namespace) -> Any:
    from ..api.needle import Needle
    from ..stages.options import staged_from_args

    model = staged_from_args(args.model, args) or args.model  # --stages / --ray
    return Needle(
        tools=load_tools(args.tools), model=model, system=args.system,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        max_new_tokens=args.max_new_tokens, reasoning_budget=args.reasoning_budget,
        auto_date=args.auto_date, grammar=not args.no_grammar,
        speculate=not getattr(args, "no_speculate", False),
        threads=getattr(args, "threads", None), mcp=getattr(args, "mcp", None),
        tool_format=getattr(args, "tool_format", None),
        template_kwargs=getattr(args, "chat_template_kwargs", None),
    )


def print_events(events: Iterator[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Show a turn: streamed deltas when --stream, then the envelope; returns the envelope."""
    from ..generation.events import Done

    envelope: dict[str, Any] = {}
    streamed = False
    for event in events:
        if isinstance(event, Done):
            envelope = event.envelope
        elif args.stream and args.json:
            print(json.dumps({"type": event.type, "text": event.text}), flush=True)
        elif args.stream:
            style = {"reasoning": "\x1b[2m", "tool_call": "\x1b[36m"}.get(event.type, "")
            reset = "\x1b[0m" if style and sys.stdout.isatty() else ""
            sys.stdout.write((style if reset else "") + event.text + reset)
            sys.stdout.flush()
            streamed = True
    if streamed:
        print()
    if args.json:
        record = {"type": "done", "envelope": envelope} if args.stream else envelope
        print(json.dumps(record, ensure_ascii=False), flush=True)
    else:
        print_envelope(envelope)
    return envelope


def print_result(envelope: dict[str, Any], args: argparse.Namespace) -> None:
    """A finished envelope (`Needle.run`): JSON with --json, else the readable summary."""
    if args.json:
        print(json.dumps(envelope, ensure_ascii=False, default=str), flush=True)
    else:
        print_envelope(envelope)


CONFIDENCE_SOURCES = {"head": "confidence head", "tokens": "the model's decisions"}


def confidence_text(envelope: dict[str, Any]) -> str:
    """The confidence and which measure it is (api/envelope.py: every local answer has one;
    an answer from the hand-off model has none of its own)."""
    confidence = envelope.get("confidence")
    if confidence is None:
        handoff = envelope.get("handoff") or {}
        return f"n/a (answered by {handoff['model']})" if handoff.get("answered") else \
            "n/a (the model decided nothing: no call was possible)"
    source = CONFIDENCE_SOURCES.get(envelope.get("confidence_source") or "", "?")
    return f"{confidence:.3f} ({source})"


def print_envelope(envelope: dict[str, Any]) -> None:
    """A readable summary of an envelope (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    kind = envelope.get("type", "?")
    colour = {"call": "green", "refuse": "yellow", "respond": "cyan"}.get(kind, "red")
    console.print(f"[bold {colour}]{kind}[/]")
    if envelope.get("reasoning"):
        console.print(f"[dim]reasoning:[/] {envelope['reasoning']}", markup=True)
    if envelope.get("function_calls"):
        table = Table(show_header=True, header_style="bold")
        table.add_column("function")
        table.add_column("arguments")
        results = envelope.get("results")
        if results:
            table.add_column("result")
        per_call = envelope.get("call_confidences") or []
        if per_call:
            table.add_column("confidence")
        for k, call in enumerate(envelope["function_calls"]):
            row = [call["name"], json.dumps(call["arguments"], ensure_ascii=False)]
            if results:
                outcome = results[k]
                row.append(json.dumps(outcome.get("result", outcome.get("error")),
                                      ensure_ascii=False))
            if per_call:
                value = per_call[k] if k < len(per_call) else None
                row.append("n/a" if value is None else f"{value:.3f}")
            table.add_row(*row)
        console.print(table)
    if envelope.get("text"):
        console.print(envelope["text"], markup=False)
    if envelope.get("error"):
        console.print(f"[red]{envelope['error']}[/]")
    timings = envelope.get("timings", {})
    conf = confidence_text(envelope)
    handoff = envelope.get("handoff")
    if handoff:
        outcome = f"answered by {handoff['model']}" if handoff.get("answered") else \
            f"kept the local answer: {handoff.get('error')}"
        console.print(f"[yellow]handed off ({handoff['reason']}): {outcome}[/]", markup=True)
    console.print(
        f"[dim]confidence {conf} | prefill {timings.get('prefill_tokens', 0)} tok "
        f"@ {timings.get('prefill_tps', 0):.0f} tok/s | decode {timings.get('decode_tokens', 0)} "
        f"tok @ {timings.get('decode_tps', 0):.0f} tok/s | {timings.get('total_s', 0):.3f} s[/]"
    )
