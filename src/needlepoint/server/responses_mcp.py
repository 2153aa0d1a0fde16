"""Server-side MCP tools on the Responses API, as OpenAI defines them.

A request's `{"type": "mcp", "server_label": L, "allowed_tools": [...], "require_approval":
...}` tool refers to the server named `L` in the `mcp.json` given to `serve --mcp`; a request
cannot make the server connect anywhere: `server_url` is refused unless the operator started
the server with `--mcp-allow-host HOST` (repeatable), and then only for those hosts (that
connection lives for the one request). `allowed_tools` (a list of names, or
`{"tool_names": [...]}`) limits the tools offered; `require_approval` is `"never"`, `"always"`
(the default, as OpenAI's), or `{"never": {"tool_names": [...]}}` /
`{"always": {"tool_names": [...]}}`. The model sees the tools under the names `McpTools`
gives them (a clash between servers prefixed with the server name).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from ..api.mcp_tools import McpTools
from ..errors import McpConfigError, McpServerError
from .errors import bad_request
from .responses_items import new_id


class McpCall:
    """One call the model made to an MCP tool: run now, or held for approval."""

    def __init__(self, tools: McpTools, label: str, name: str, arguments: str,
                 needs_approval: bool, call_id: str | None = None) -> None:
        self.tools, self.label, self.name, self.arguments = tools, label, name, arguments
        self.needs_approval = needs_approval
        self.id = call_id or new_id("mcp")
        self.output: str | None = None
        self.error: str | None = None

    async def run(self) -> None:
        try:
            parsed = json.loads(self.arguments or "{}")
            entry = await asyncio.to_thread(self.tools.call, self.name, parsed)
        except McpServerError as failure:  # the model sees it; the response still completes
            self.error = str(failure)
            return
        except ValueError:
            self.error = "the arguments are not a JSON object"
            return
        if "error" in entry:
            self.error = str(entry["error"])
        else:
            value = entry["result"]
            self.output = value if isinstance(value, str) else json.dumps(value)

    def item(self, status: str) -> dict[str, Any]:
        item = {"type": "mcp_call", "id": self.id, "server_label": self.label,
                "name": self.name, "arguments": self.arguments, "output": self.output,
                "error": self.error, "status": status}
        return item

    def approval_item(self) -> dict[str, Any]:
        return {"type": "mcp_approval_request", "id": self.id, "server_label": self.label,
                "name": self.name, "arguments": self.arguments}

    def messages(self) -> list[dict[str, Any]]:
        """The call and its result as chat messages (what the model sees next)."""
        content = self.output if self.error is None else f"error: {self.error}"
        return [{"role": "assistant", "content": None, "tool_calls": [
            {"id": self.id, "type": "function",
             "function": {"name": self.name, "arguments": self.arguments or "{}"}}]},
            {"role": "tool", "tool_call_id": self.id, "content": content or ""}]


class McpPlan:
    """The MCP tools of one request: chat tools for the model and how to run each."""

    def __init__(self) -> None:
        self.chat_tools: list[dict[str, Any]] = []
        self.routes: dict[str, tuple[McpTools, str, bool]] = {}  # name -> tools, label, approve
        self.owned: list[McpTools] = []

    def owns(self, name: str) -> bool:
        return name in self.routes

    def call(self, name: str, arguments: str, call_id: str | None = None) -> McpCall:
        tools, label, approve = self.routes[name]
        return McpCall(tools, label, name, arguments, approve, call_id)

    def approvals(self, items: Any, previous: Mapping[str, Any] | None) -> list[McpCall]:
        """The approved calls of the request's `mcp_approval_response` items (declined ones
        are told to the model as such), looked up in the previous response's output."""
        if not isinstance(items, list):
            return []
        asked = {item["id"]: item for item in (previous or {}).get("response", {})
                 .get("output", []) if item.get("type") == "mcp_approval_request"}
        calls = []
        for k, item in enumerate(items):
            if item.get("type") != "mcp_approval_response":
                continue
            request = asked.get(item.get("approval_request_id"))
            if request is None or not self.owns(request["name"]):
                raise bad_request(f"Invalid 'input[{k}].approval_request_id': no pending "
                                  "approval request with that id (send previous_response_id "
                                  "and the same mcp tools).",
                                  param=f"input[{k}].approval_request_id")
            call = self.call(request["name"], request["arguments"], request["id"])
            if item.get("approve") is not True:
                call.error = "the user declined this call"
                call.needs_approval = False
                call.run = _declined  # type: ignore[method-assign]
            calls.append(call)
        return calls

    def close(self) -> None:
        for tools in self.owned:
            tools.close()


async def _declined() -> None:
    return None


class McpBridge:
    """The MCP servers of `serve --mcp` and the hosts a request's `server_url` may name."""

    def __init__(self, tools: McpTools | None, hosts: Sequence[str] = ()) -> None:
        self.tools = tools
        self.hosts = tuple(h.lower() for h in hosts)

    def listing(self) -> list[dict[str, Any]]:
        """Every configured MCP tool with its server (the playground's list)."""
        return [] if self.tools is None else [t.listing() for t in self.tools.tools]

    def plan(self, tools: list[dict[str, Any]] | None) -> McpPlan:
        plan = McpPlan()
        try:
            for k, tool in enumerate(tools or []):
                if tool.get("type") == "mcp":
                    self._add(plan, k, tool)
        except BaseException:
            plan.close()
            raise
        return plan

    def _add(self, plan: McpPlan, k: int, tool: Mapping[str, Any]) -> None:
        where = f"tools[{k}]"
        label = tool.get("server_label")
        if not isinstance(label, str) or not label:
            raise bad_request(f"Invalid '{where}.server_label': expected a string.",
                              param=f"{where}.server_label")
        source = self._source(plan, where, label, tool)
        allowed = tool.get("allowed_tools")
        if isinstance(allowed, Mapping):
            allowed = allowed.get("tool_names")
        if allowed is not None and (not isinstance(allowed, list) or
                                    not all(isinstance(n, str) for n in allowed)):
            raise bad_request(f"Invalid '{where}.allowed_tools': expected a list of tool names.",
                              param=f"{where}.allowed_tools")
        approve_all, listed = _approval(tool.get("require_approval", "always"), where)
        offered = [t for t in source.tools if t.server == label and
                   (allowed is None or t.tool in allowed or t.name in allowed)]
        for entry in offered:
            if entry.name in plan.routes:
                raise bad_request(f"Invalid '{where}': the tool {entry.name!r} is offered twice.",
                                  param=where)
            approve = approve_all != (entry.tool in listed)
            plan.routes[entry.name] = (source, label, approve)
            plan.chat_tools.append({"type": "function", "function": {
                "name": entry.name, "description": entry.description,
                "parameters": entry.parameters}})

    def _source(self, plan: McpPlan, where: str, label: str, tool: Mapping[str, Any]
                ) -> McpTools:
        url = tool.get("server_url")
        if url is None:
            if self.tools is None or label not in self.tools.servers:
                known = sorted(self.tools.servers) if self.tools is not None else []
                raise bad_request(f"Invalid '{where}.server_label': no MCP server {label!r} is "
                                  f"configured on this server (known: {known}; start it with "
                                  "`needlepoint serve --mcp mcp.json`).",
                                  param=f"{where}.server_label", code="unknown_mcp_server")
            return self.tools
        host = (urlparse(str(url)).hostname or "").lower()
        if not self.hosts or host not in self.hosts:
            raise bad_request(f"Invalid '{where}.server_url': this server does not connect to "
                              "URLs a request names (the operator allows hosts with "
                              "`--mcp-allow-host`).", param=f"{where}.server_url",
                              code="server_url_not_allowed")
        headers = tool.get("headers") or {}
        try:
            tools = McpTools({"mcpServers": {label: {"url": url, "headers": headers}}})
        except (McpConfigError, McpServerError) as error:
            raise bad_request(f"Invalid '{where}.server_url': {error}",
                              param=f"{where}.server_url") from None
        plan.owned.append(tools)
        return tools


def _approval(value: Any, where: str) -> tuple[bool, set[str]]:
    """(approval by default, the tool names that are the exception)."""
    if value in ("never", "always"):
        return value == "always", set()
    if isinstance(value, Mapping) and len(value) == 1:
        (mode, names), = value.items()
        if mode in ("never", "always") and isinstance(names, Mapping):
            return mode != "always", set(names.get("tool_names") or [])
    raise bad_request(f"Invalid '{where}.require_approval': expected \"never\", \"always\", or "
                      "{\"never\" | \"always\": {\"tool_names\": [...]}}.",
                      param=f"{where}.require_approval")
