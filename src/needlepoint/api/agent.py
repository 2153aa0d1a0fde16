"""The agent side of `Needle` (a base class): executing calls, the agent loop, MCP tools and
the confidence hand-off.

`Needle(tools, mcp=...)` adds every tool of the `mcp.json` servers (`mcp_tools.py`); `execute`
runs a Python function or an MCP tool alike, and a tool's failure (a Python exception, an MCP
`isError`) is the call's `error`, which the model sees; an MCP server that fails raises
`McpServerError`. `Needle(..., handoff=Handoff(...))` reviews every finished answer of
`complete`, `chat`, `send_tool_results` (and so `run`): an unsure one is answered by the
hand-off endpoint instead (`handoff.py`), sent the chat so far (`Chat.openai_messages`: the
messages the local model was shown). The answer that was returned is the one the chat keeps,
so the next turn, local or handed off, continues from what the user was given. Streams
(`stream`, `chat_stream`) are never handed off: their tokens are already out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import McpServerError, NeedlepointError
from .chat import tool_messages
from .chat_state import ChatState
from .handoff import Handoff
from .mcp_tools import McpTools, attach
from .results import call_key, check_rounds, final, jsonable, summary
from .tools import ToolSpec, tool_specs


class AgentMixin:
    """Execution, the agent loop, MCP connections and hand-off for `Needle`."""

    tools: list[ToolSpec]
    mcp: McpTools | None
    handoff: Handoff | None
    max_rounds: int
    state: ChatState

    def _attach(self, tools: Iterable[Any], mcp: Any, handoff: Any) -> list[ToolSpec]:
        """The constructor's tools plus those of the MCP servers (connected now)."""
        if handoff is not None and not isinstance(handoff, Handoff):
            raise TypeError(f"handoff must be a needlepoint Handoff, got {handoff!r}")
        self.handoff = handoff
        self.mcp, self._owns_mcp = None, False
        local = tool_specs(tools)
        self.mcp, self._owns_mcp, extra = attach(mcp, local)
        try:
            return tool_specs([*local, *extra])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the MCP servers this `Needle` started (not an `McpTools` passed in)."""
        if self.mcp is not None and self._owns_mcp:
            self.mcp.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ hand-off
    def _reviewed(self, envelope: dict[str, Any], options: Mapping[str, Any]
                  ) -> dict[str, Any]:
        """`envelope` (the chat's last answer), or, when `handoff` says so, the endpoint's
        answer to the chat before it, which then replaces it in the chat."""
        if self.handoff is None:
            return envelope
        chat = self.state.chat
        tools = [spec.schema() for spec in self.state.specs]
        reviewed = self.handoff.review(envelope, chat.openai_messages(stop=-1), tools, options)
        if reviewed.get("handoff", {}).get("answered"):
            chat.replace_answer(reviewed)
        return reviewed

    def send_tool_results(self, results: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        """Give tool results (`[{"name", "result" | "error"}]`) back as the next turn (in
        Needle's format a user turn `<tool_result>...</tool_result>`)."""
        if self.state.conversation is None:
            raise NeedlepointError("no conversation to send tool results to")
        return self._reviewed(final(self._next_turn(tool_messages(results), options)),
                              options)

    # ------------------------------------------------------------------ agent loop
    def execute(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """Run one call's Python function or MCP tool: `{"name", "arguments", "result" |
        "error"}` (MCP tools add `"server"`). An MCP server failure raises McpServerError."""
        entry: dict[str, Any] = {"name": call["name"], "arguments": call["arguments"]}
        spec = next((s for s in self.tools if s.name == call["name"]), None)
        server = self.mcp.server_of(call["name"]) if self.mcp is not None else None
        if server is not None:
            entry["server"] = server
        try:
            if spec is None:
                raise NeedlepointError(f"unknown tool {call['name']!r}")
            entry["result"] = jsonable(spec.call(call["arguments"]))
        except McpServerError:
            raise
        except Exception as error:  # a tool's failure is reported to the model, not raised
            entry["error"] = f"{type(error).__name__}: {error}"
        return entry

    def run(self, query: str, *, max_rounds: int | None = None, **options: Any
            ) -> dict[str, Any]:
        """Answer `query`, executing the calls the model asks for (the agent loop).

        A round executes the latest answer's new calls (each distinct call once per `run`)
        and sends their results back as a user turn; the reply's new calls start another
        round, up to `max_rounds` (default: the constructor's, 1). Calls asked for after the
        last round are never executed (they stay in `turns[-1]["function_calls"]`).

        Returns the last turn's envelope with `function_calls`/`results` listing every call
        executed (in order), `type` "call" if any ran, `turns` holding each turn's envelope,
        `confidence` the lowest over the turns, and timings summed."""
        rounds = self.max_rounds if max_rounds is None else check_rounds(max_rounds)
        envelope = self.complete(query, **options)
        turns, results, done = [envelope], [], set()
        for _ in range(rounds):
            calls = [c for c in envelope["function_calls"] if call_key(c) not in done]
            if envelope["type"] != "call" or not calls:
                break
            round_results = [self.execute(call) for call in calls]
            done.update(call_key(call) for call in calls)
            results.extend(round_results)
            feedback = [{k: v for k, v in r.items() if k not in ("arguments", "server")}
                        for r in round_results]
            envelope = self.send_tool_results(feedback, **options)
            turns.append(envelope)
        return summary(turns, results)

    # provided by Needle
    def complete(self, text: str, **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _next_turn(self, added: list[dict[str, Any]], options: dict[str, Any]) -> Any:
        raise NotImplementedError
