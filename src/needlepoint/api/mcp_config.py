"""The `mcp.json` file: `{"mcpServers": {name: {...}}}`, the form Claude Desktop, Cursor and LM
Studio read.

A server is either a stdio process, `{"command", "args", "env", "cwd"}`, or a streamable-HTTP
endpoint, `{"url", "headers"}`. Keys of our own, all optional: `"timeout"` (seconds a call
may take; default `DEFAULT_TIMEOUT_S`), `"start_timeout"` (seconds to start and list the
tools; default `DEFAULT_START_TIMEOUT_S`) and `"disabled": true` (the entry is skipped, as
other hosts do). A relative `cwd` is read against the folder of the `mcp.json` itself, and
a `command` of `python` / `python3` runs this interpreter (`sys.executable`), so the shipped
`examples/mcp.json` works from any folder and in any virtual environment that has
needlepoint installed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import McpConfigError

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_START_TIMEOUT_S = 60.0  # a stdio server that imports a large package starts slowly
PYTHON_COMMANDS = ("python", "python3")
COMMON_KEYS = {"timeout", "start_timeout", "disabled", "type"}
STDIO_KEYS = {"command", "args", "env", "cwd", *COMMON_KEYS}
HTTP_KEYS = {"url", "headers", *COMMON_KEYS}


@dataclass(frozen=True)
class ServerConfig:
    """One entry of `mcpServers`: a stdio command or an HTTP url (never both)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT_S
    start_timeout: float = DEFAULT_START_TIMEOUT_S

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


def load_config(source: str | Path | Mapping[str, Any], *,
                timeout: float | None = None) -> list[ServerConfig]:
    """The servers of an `mcp.json` path or an already parsed dict (in file order).
    `timeout`, when given, replaces every server's default (not an explicit `"timeout"`)."""
    where, base = "the mcp config", None
    if isinstance(source, str | Path):
        path = Path(source)
        where, base = str(path), path.resolve().parent
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise McpConfigError(f"{where}: cannot read it ({error.strerror or error})") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise McpConfigError(f"{where}: not valid UTF-8 JSON ({error})") from None
    else:
        data = source
    if not isinstance(data, Mapping) or not isinstance(data.get("mcpServers"), Mapping):
        raise McpConfigError(f'{where}: expected an object {{"mcpServers": {{name: server}}}}')
    servers = []
    for name, entry in data["mcpServers"].items():
        if not isinstance(entry, Mapping):
            raise McpConfigError(f"{where}: server {name!r} must be an object")
        if entry.get("disabled") is True:
            continue
        servers.append(_server(str(name), entry, where, base, timeout))
    return servers


def _server(name: str, entry: Mapping[str, Any], where: str, base: Path | None,
            default_timeout: float | None) -> ServerConfig:
    def bad(message: str) -> McpConfigError:
        return McpConfigError(f"{where}: server {name!r}: {message}")

    if not name.strip():
        raise bad("the server name is empty")
    timeout = _seconds(entry, "timeout", default_timeout or DEFAULT_TIMEOUT_S, bad)
    start = _seconds(entry, "start_timeout", DEFAULT_START_TIMEOUT_S, bad)
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise bad('give either "command" (a stdio server) or "url" (streamable HTTP)')
    unknown = set(entry) - (STDIO_KEYS if has_command else HTTP_KEYS)
    if unknown:
        raise bad(f"unknown key(s) {sorted(unknown)}")
    if has_url:
        url = entry["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise bad(f"url must be an http:// or https:// URL, got {url!r}")
        return ServerConfig(name, url=url, headers=_strings(entry, "headers", bad),
                            timeout=timeout, start_timeout=start)
    command = entry["command"]
    if not isinstance(command, str) or not command.strip():
        raise bad("command must be a non-empty string")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad("args must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise bad("cwd must be a string")
    if cwd is not None and base is not None and not Path(cwd).is_absolute():
        cwd = str(base / cwd)
    if command in PYTHON_COMMANDS:
        command = sys.executable  # the interpreter that has `mcp` installed
    return ServerConfig(name, command=command, args=tuple(args), env=_strings(entry, "env", bad),
                        cwd=cwd, timeout=timeout, start_timeout=start)


def _seconds(entry: Mapping[str, Any], key: str, default: float, bad: Any) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise bad(f"{key} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _strings(entry: Mapping[str, Any], key: str, bad: Any) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise bad(f"{key} must be an object of strings")
    return dict(value)
