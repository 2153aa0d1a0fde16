"""`needlepoint serve`: a subcommand module for the `needlepoint` dispatcher (`HELP`,
`add_arguments`, `run`), plus `serve(...)` and a stand-alone `main(argv)`.

FastAPI and uvicorn are imported only when the server actually starts, so the CLI's
`--help` stays fast and works without the `server` extra.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionError, NeedlepointError
from .settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_KV_BYTES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_SESSIONS,
)

MAX_PORT = 65535
HELP = "serve a model over an OpenAI-compatible HTTP API (needs the 'server' extra)"


class MissingExtraError(NeedlepointError, ImportError):
    """The server's dependencies (the `server` extra) are not installed."""


class ServeOptionError(NeedlepointError, ValueError):
    """A server option that cannot work (an empty API key, ...)."""


def serve(
    model: Any = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    log_level: str = "info",
    batching: bool = True,
    max_kv_bytes: int | None = DEFAULT_MAX_KV_BYTES,
    step_tokens: int | None = None,
    threads: int | None = None,
    speculate: bool = True,
    api_keys: Sequence[str] | None = None,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    tool_format: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
    mcp: Any = None,
    mcp_hosts: Sequence[str] = (),
    handoff: Any = None,
) -> None:
    """Load `model` once (a path; None: `$NEEDLEPOINT_MODEL`, else the bundled demo model)
    and serve it until interrupted (blocking). `threads`: `needlepoint.load(threads=...)`.
    `api_keys` plus `$NEEDLEPOINT_API_KEY`: the keys `/v1/*` accepts (none: open; a warning
    when the address is reachable from other machines). `mcp`: an mcp.json path or dict
    (its servers start now and stop with the server); `mcp_hosts`: the hosts a Responses
    request's `server_url` may name; `handoff`: an `api.handoff.Handoff`."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise InvalidOptionError(f"port must be 0-{MAX_PORT}, got {port!r}")
    try:
        import uvicorn  # noqa: F401 - checked here, used by _run

        from .app import create_app
    except ImportError as error:
        raise MissingExtraError(
            f"the server needs FastAPI and uvicorn ({error.name} is missing): "
            "pip install 'needlepoint[server]'"
        ) from None
    from ..models.hub import resolve_model_path
    from .auth import KeyConfigError, keys_from
    from .memory import limit_arenas

    limit_arenas()  # before any worker thread exists (memory.py: RSS creep under load)

    try:
        keys = keys_from(api_keys)
    except KeyConfigError as error:
        raise ServeOptionError(str(error)) from None
    model_name = None
    if model is None or isinstance(model, str | os.PathLike):
        model = resolve_model_path(model)
        model_name = served_name(model)
        if threads is not None:
            from ..models.hub import load_model

            model = load_model(model, threads=threads)
    factory = needle_factory(tool_format, template_kwargs)
    tools = None
    if mcp is not None:
        from ..api.mcp_tools import McpTools

        tools = McpTools(mcp)  # at startup: a server that does not start is an error naming it
    try:
        app = create_app(model, workers=workers, max_queue=max_queue,
                         max_body_bytes=max_body_bytes, batching=batching,
                         max_kv_bytes=max_kv_bytes, step_tokens=step_tokens,
                         speculate=speculate, api_keys=keys, body_timeout_s=body_timeout_s,
                         needle_factory=factory, mcp=tools, mcp_hosts=mcp_hosts,
                         handoff=handoff, model_name=model_name)
        _run(app, host, port, keys, log_level)
    finally:
        if tools is not None:
            tools.close()


def _run(app: Any, host: str, port: int, keys: Sequence[str], log_level: str) -> None:
    import uvicorn

    from .auth import exposure_warning

    warning = exposure_warning(host, port, keys)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    # One process: parallelism comes from the app's worker threads, which share the weights;
    # uvicorn's own `workers` would fork N processes holding N copies of the model.
    # uvicorn's own access log is off: `needlepoint.access` (server/observe.py) writes one
    # line per request with its x-request-id, through uvicorn's handler and format.
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                log_config=_log_config(log_level))


def needle_factory(tool_format: str | None, template_kwargs: dict[str, Any] | None) -> Any:
    """The server's `Needle` maker for `--tool-format` / `--chat-template-kwargs` : the call
    syntax for every request, the template variables as every request's
    defaults, under the request's own `chat_template_kwargs`; None: plain `Needle`."""
    if tool_format in (None, "auto") and not template_kwargs:
        return None
    from ..api.needle import Needle

    defaults = dict(template_kwargs or {})

    def make(**kwargs: Any) -> Needle:
        kwargs["template_kwargs"] = {**defaults, **(kwargs.get("template_kwargs") or {})}
        return Needle(tool_format=tool_format, **kwargs)

    return make


def _log_config(level: str) -> dict[str, Any]:
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["needlepoint"] = {"handlers": ["default"], "level": level.upper(),
                                        "propagate": False}
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", help="a .cact or .gguf file, a Hugging Face model directory, or "
                        "smollm2 (default: $NEEDLEPOINT_MODEL, else the bundled demo model)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--workers",
        type=_at_least(1),
        default=None,
        help=f"requests decoded at once: live sessions of the batching scheduler (default "
        f"{DEFAULT_SESSIONS}), or with --no-batching threads of their own (default: one per CPU)",
    )
    parser.add_argument(
        "--no-batching", dest="batching", action="store_false",
        help="no continuous batching: each request runs its model work on its own thread",
    )
    parser.add_argument(
        "--max-kv-bytes",
        type=_at_least(1),
        default=DEFAULT_MAX_KV_BYTES,
        help="cap on the live sessions' KV caches (at full capacity), else 429 "
        f"(default {DEFAULT_MAX_KV_BYTES})",
    )
    parser.add_argument(
        "--step-tokens",
        type=_at_least(1),
        default=None,
        help="batching: token rows per engine step (decode steps, then prefill chunks; "
        "default 256)",
    )
    parser.add_argument(
        "--max-queue",
        type=_at_least(0),
        default=DEFAULT_MAX_QUEUE,
        help=f"requests waiting for a worker before 429 (default {DEFAULT_MAX_QUEUE})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_at_least(1),
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest accepted request body, else 413 (default {DEFAULT_MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--body-timeout", type=_positive_seconds, default=DEFAULT_BODY_TIMEOUT_S,
        metavar="SECONDS",
        help=f"a request body not received this long after the headers gets 408 "
        f"(default {DEFAULT_BODY_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    parser.add_argument("--threads", type=_at_least(1), default=None,
                        help="CPU threads for the model (default: $NEEDLEPOINT_THREADS, else 1)")
    parser.add_argument("--no-speculate", dest="speculate", action="store_false",
                        help="decode one forward pass per token (no drafts; same tokens)")
    from ..generation.syntaxes import tool_formats

    parser.add_argument("--tool-format", choices=tool_formats(), default=None,
                        help="a chat-template model's tool-call syntax (default auto: the one "
                        "its chat template uses)")
    parser.add_argument("--chat-template-kwargs", type=_template_kwargs, default=None,
                        metavar="JSON", help="default variables for a chat-template model's "
                        """template, e.g. '{"enable_thinking": false}' (a request's """
                        "chat_template_kwargs go on top)")
    from ..stages.options import add_stage_arguments

    parser.add_argument("--api-key", dest="api_keys", action="append", metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on /v1/* (repeatable; also "
                        "$NEEDLEPOINT_API_KEY)")
    add_stage_arguments(parser)  # --stages, --ray, --placement (docs/distributed.md)
    parser.add_argument("--mcp", metavar="MCP_JSON",
                        help="MCP servers for /v1/responses mcp tools and the playground")
    parser.add_argument("--mcp-allow-host", dest="mcp_hosts", action="append", default=[],
                        metavar="HOST", help="a host a Responses request's mcp server_url may "
                        "name (repeatable; default: none, server_url is refused)")
    parser.add_argument("--handoff-url", metavar="URL", help="OpenAI-compatible endpoint "
                        "(.../v1) that answers when the local answer is unsure")
    parser.add_argument("--handoff-model", metavar="M", help="the endpoint's model name")
    parser.add_argument("--handoff-below", type=float, default=0.7, metavar="C",
                        help="hand off answers whose confidence is below C (default 0.7)")
    parser.add_argument("--handoff-key-env", metavar="NAME",
                        help="environment variable holding the endpoint's API key")


def _handoff(args: argparse.Namespace) -> Any:
    url = getattr(args, "handoff_url", None)
    if url is None:
        return None
    if not getattr(args, "handoff_model", None):
        raise ServeOptionError("--handoff-url needs --handoff-model")
    from ..api.handoff import Handoff

    return Handoff(url, args.handoff_model, api_key_env=args.handoff_key_env,
                   below=args.handoff_below)


def served_name(path: Path) -> str:
    """The model's name in `/v1/models`: the path given (a directory's name, a file's stem),
    not a symlink's target (the loader resolves links)."""
    return path.name if path.is_dir() else path.stem


def run(args: argparse.Namespace) -> int:
    from ..stages.options import staged_from_args

    model = staged_from_args(args.model, args) or args.model  # --stages / --ray
    serve(
        model,
        host=args.host,
        port=args.port,
        workers=args.workers,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        batching=args.batching,
        max_kv_bytes=args.max_kv_bytes,
        step_tokens=args.step_tokens,
        threads=args.threads,
        speculate=getattr(args, "speculate", True),
        api_keys=getattr(args, "api_keys", None),
        body_timeout_s=getattr(args, "body_timeout", DEFAULT_BODY_TIMEOUT_S),
        tool_format=getattr(args, "tool_format", None),
        template_kwargs=getattr(args, "chat_template_kwargs", None),
        mcp=getattr(args, "mcp", None),
        mcp_hosts=getattr(args, "mcp_hosts", ()),
        handoff=_handoff(args),
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m needlepoint.server ...`: the subcommand without the dispatcher."""
    parser = argparse.ArgumentParser(prog="needlepoint serve", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except NeedlepointError as error:
        parser.exit(2, f"needlepoint serve: error: {error}\n")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _template_kwargs(text: str) -> dict[str, Any]:
    from ..formats.chat_format import parse_template_kwargs

    try:
        return parse_template_kwargs(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
