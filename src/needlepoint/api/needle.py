"""`Needle`: tool calling in the shape users of `cactus-needle` know.

    needle = needlepoint.Needle(tools=[set_alarm, get_weather])
    needle.complete("wake me at 6:45")   # -> {"type": "call", "function_calls": [...], ...}
    needle.run("wake me at 6:45")        # also executes the calls (one round), feeds results back
    for event in needle.stream("..."):   # ReasoningDelta / TextDelta / ToolCallDelta / Done
        ...

Each `Needle` owns its conversation (session, history); instances never share state (only
the read-only weights, through the explicit `hub.ModelCache`). `complete`/`stream` start a
fresh conversation, `chat` continues the current one, `reset` forgets it.

`auto_date` defaults to False, unlike upstream's packaged API (the bundled demo model was
trained without a system turn). `extract(text, schema)` is one forced tool call whose
parameters are the schema. Any model works: Needle's wire format, or a chat template model
(`model.chat_format`; history rendered whole, one grammar per answer: `template_chat.py`).

Tool retrieval (Needle 2's contrastive head): past `retrieve_threshold` tools, only the
`retrieve_k` closest to the first query. Per-call options: docs/api.md. With no tools (and
calls allowed) a turn refuses at once (`note`); a chat outgrowing the context drops old turns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import InvalidQueryError, NeedlepointError
from ..formats import needle_wire as wire
from ..formats.chat_format import with_call_options
from ..generation.events import DeltaEvent, Done
from ..generation.retrieval import (
    DEFAULT_RETRIEVE_K,
    DEFAULT_RETRIEVE_THRESHOLD,
    RetrievalUnavailableError,
)
from ..generation.turn_config import GenerationConfig
from ..models.hub import MODEL_CACHE, ModelCache, load_model
from .agent import AgentMixin
from .chat import Chat
from .chat_state import ChatState
from .context import answer_room, fitting_replay, replay_ids
from .conversation import Conversation
from .grammars import GRAMMAR_VOCABS
from .many import complete_many
from .plan import Plan
from .planner import NO_TOOLS_NOTE, TurnPlanner
from .results import annotated, check_rounds, final, jsonable
from .template_chat import template_turn
from .tools import ToolSpec, from_dict, from_pydantic, tool

__all__ = ["ExtractionError", "GRAMMAR_VOCABS", "NO_TOOLS_NOTE", "Needle",
           "RetrievalUnavailableError", "jsonable", "tool"]

EXTRACT_TOOL = "extract"
EXTRACT_DESCRIPTION = "Extract the requested fields from the text."


class ExtractionError(NeedlepointError):
    """The model declined to extract (it answered `[]` or without a call)."""


def check_query(text: Any) -> str:
    """The user's text, or InvalidQueryError (a ValueError) when it is not a non-blank
    string: an empty query would still get a confident-looking call."""
    if not isinstance(text, str):
        raise InvalidQueryError(f"the query must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidQueryError("the query is empty: there is nothing to answer")
    return text


class Needle(AgentMixin):
    """A tool-calling assistant over one model: a `TurnPlanner` (tools, options, grammars,
    retrieval) and a `ChatState` (the chat it continues), each its own object;
    executing calls, the agent loop, MCP tools and hand-off come from `agent.py`."""

    def __init__(
        self, tools: Iterable[Any] = (), model: Any = None,
        system: str | Mapping[str, Any] | None = None, *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        max_new_tokens: int = 512,
        reasoning_budget: int | None = 256,
        auto_date: bool = False,
        grammar: bool = True,
        max_rounds: int = 1,
        kv_window: int | None = None,
        cache: ModelCache | None = MODEL_CACHE,
        retrieve_k: int | None = DEFAULT_RETRIEVE_K,
        retrieve_threshold: int = DEFAULT_RETRIEVE_THRESHOLD,
        speculate: bool = True,
        threads: int | None = None,
        tool_format: str | None = None, template_kwargs: Mapping[str, Any] | None = None,
        mcp: Any = None,  # an mcp.json path or dict, or McpTools (agent.py)
        handoff: Any = None,  # a Handoff: unsure answers go to a bigger model (handoff.py)
    ) -> None:
        self.model = load_model(model, cache, threads)
        self.tokenizer = self.model.tokenizer
        self.tools: list[ToolSpec] = self._attach(tools, mcp, handoff)
        self.system = system
        self.auto_date = auto_date
        self.max_rounds = check_rounds(max_rounds)
        self.kv_window = kv_window
        defaults = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                    "max_new_tokens": max_new_tokens, "reasoning_budget": reasoning_budget,
                    "speculate": speculate}
        chat_format = with_call_options(self.model.chat_format, tool_format, template_kwargs)
        self.planner = TurnPlanner(self.model, self.tools, defaults, grammar=grammar,
                                   retrieve_k=retrieve_k, retrieve_threshold=retrieve_threshold,
                                   chat_format=chat_format)
        self.tools = self.planner.tools  # without the tools the grammar cannot hold
        self.format = self.planner.format
        self.whole_answer = self.planner.whole_answer  # a template model (answer_grammar.py)
        self.state = ChatState(specs=self.tools, grammar=self.planner.grammar)

    # ------------------------------------------------------------------ configuration
    @property
    def defaults(self) -> dict[str, Any]:
        return self.planner.defaults

    def config(self, **overrides: Any) -> GenerationConfig:
        """The generation settings of one call: the constructor's, with `overrides`."""
        return self.planner.config(**overrides)

    # ------------------------------------------------------------------ tool retrieval
    @property
    def retrieval_active(self) -> bool:
        """Whether conversations offer only the top `retrieve_k` tools: retrieval is on, the
        model has a contrastive head, and there are more than `retrieve_threshold` tools."""
        return self.planner.retrieval_active

    def rank_tools(self, query: str) -> list[tuple[float, dict[str, Any]]]:
        """Every tool's `(cosine similarity to query, schema)`, best first (ties in the
        original order). Raises `RetrievalUnavailableError` without a contrastive head."""
        return self.planner.rank(query)

    def retrieve_tools(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        """The schemas of the `k` tools closest to `query` (default `retrieve_k`, or 5 when
        retrieval is off), best first."""
        return self.planner.retrieve(query, k)

    def offered_tools(self, query: str) -> list[ToolSpec]:
        """The tools a conversation starting with `query` shows the model: all of them, or,
        when `retrieval_active`, the top `retrieve_k` in their original order."""
        return self.planner.offered(query)

    def system_text(self) -> str:
        system = self.system
        return wire.with_date(system) if self.auto_date else wire.render_system(system)

    def prompt_ids(self, query: str, specs: list[ToolSpec] | None = None) -> list[int]:
        """The first turn's token ids for `query` (BOS, system facts, tools, query); the
        tools are `offered_tools(query)` unless `specs` says otherwise."""
        query = check_query(query)
        tools = [spec.schema() for spec in (self.offered_tools(query) if specs is None
                                            else specs)]
        return self.format.first_ids(tools, query, self.system_text())

    def chat_ids(self, chat: Chat) -> list[int]:
        """A whole chat's token ids up to the answer to be generated, as this model's chat
        format renders it, with the tools its first user message is offered (a first turn:
        `prompt_ids(chat.query)`)."""
        tools = [spec.schema() for spec in self.offered_tools(check_query(chat.query))]
        return self.format.conversation_ids(chat.messages, tools)

    def openai_messages(self) -> list[dict[str, Any]]:
        """The current chat in OpenAI's wire shape (what a hand-off endpoint is sent)."""
        return self.state.chat.openai_messages()

    # ------------------------------------------------------------------ turns
    def reset(self) -> None:
        """Forget the conversation (the next `chat` starts a new one)."""
        self.state.reset()

    def _new_conversation(self) -> Conversation:
        """A fresh conversation (its own session) on this Needle's model and settings."""
        return Conversation(self.model, self.planner.vocab, kv_window=self.kv_window)

    def _turn(self, conversation: Conversation, ids: list[int], plan: Plan
              ) -> Iterator[DeltaEvent | Done]:
        events = conversation.turn(ids, plan.config, plan.grammar, content=plan.content,
                                   check_tools=plan.check_tools, parallel_calls=plan.parallel)
        for event in annotated(events, plan.notes):
            if isinstance(event, Done):
                self.state.chat.add_answer(event.envelope, conversation.last_answer)
            yield event

    def stream(self, text: str, **options: Any) -> Iterator[DeltaEvent | Done]:
        """Start a new conversation with `text`; yield events as tokens are decoded."""
        text = check_query(text)
        specs = self.offered_tools(text)
        plan = self.planner.plan(specs, options)
        # Later turns keep these tools: the model only ever saw their schemas.
        conversation = self._new_conversation()
        self.state.start(conversation, specs, self.planner.grammar_for(specs),
                         self.system_text(), text)
        yield from self._turn(conversation, self.prompt_ids(text, specs), plan)

    def stream_ids(self, ids: Sequence[int], query: str, **options: Any
                   ) -> Iterator[DeltaEvent | Done]:
        """Decode one turn after `ids` (a whole conversation as token ids, e.g. a replayed
        client history) on a fresh session, constrained to the tools `query` (the first user
        turn) is offered; the instance's own conversation is left alone."""
        plan = self.planner.plan(self.offered_tools(check_query(query)), options)
        yield from annotated(self._new_conversation().turn(
            list(ids), plan.config, plan.grammar, content=plan.content,
            check_tools=plan.check_tools, parallel_calls=plan.parallel), plan.notes)

    def complete(self, text: str, **options: Any) -> dict[str, Any]:
        """Start a new conversation with `text`; return the turn's envelope."""
        return self._reviewed(final(self.stream(text, **options)), options)

    complete_many = complete_many  # many first turns decoded as one batch (many.py)

    def chat_stream(self, text: str, **options: Any) -> Iterator[DeltaEvent | Done]:
        """Continue the conversation with a user turn (the first one shows the tools). When
        the context cannot hold it and an answer, the oldest turns are dropped and the
        envelope's `dropped_turns` says how many."""
        text = check_query(text)
        if self.state.conversation is None:
            yield from self.stream(text, **options)
            return
        yield from self._next_turn([{"role": "user", "content": text}], options)

    def _next_turn(self, added: list[dict[str, Any]], options: dict[str, Any]
                   ) -> Iterator[DeltaEvent | Done]:
        """Add `added` messages to the chat and decode its next answer; a turn that fails
        leaves the chat as it was."""
        chat = self.state.chat
        size = len(chat.messages)
        chat.messages.extend(added)
        try:
            yield from (template_turn(self.planner, self.state, options) if self.whole_answer
                        else self._wire_turn(options))
        except Exception:
            chat.truncate(size)
            raise

    def _wire_turn(self, options: dict[str, Any]) -> Iterator[DeltaEvent | Done]:
        """The next turn in Needle's wire format: the new user turn appended to the session;
        after an answer given elsewhere (a hand-off's) the chat is re-rendered (the session
        keeps the prefix it shares); past the context the oldest exchanges are dropped."""
        state = self.state
        conversation = state.conversation
        assert conversation is not None
        specs = state.specs
        plan = self.planner.plan(specs, options)
        tools = [spec.schema() for spec in specs]

        def first_prompt(query: str) -> list[int]:
            return self.format.first_ids(tools, check_query(query), state.chat.system)

        kept, content = state.kept(self.format)
        if state.chat.answer_generated:
            ids = conversation.user_turn_ids(content)
        else:
            ids = conversation.resume(replay_ids(first_prompt, self.format, kept, content))
        limit = conversation.context_limit
        room = answer_room(limit, plan.config.max_new_tokens)
        if conversation.position - len(conversation.pending) + len(ids) + room > limit:
            dropped, ids = fitting_replay(first_prompt, self.format, kept, content, limit,
                                          room)
            conversation = self._new_conversation()
            state.dropped_more(dropped, conversation)
            plan.notes["dropped_turns"] = dropped
        yield from self._turn(conversation, ids, plan)

    def chat(self, text: str, **options: Any) -> dict[str, Any]:
        """Continue the conversation with a user turn; return its envelope."""
        return self._reviewed(final(self.chat_stream(text, **options)), options)

    # ------------------------------------------------------------------ extraction
    def extract(self, text: str, schema: Any, **options: Any) -> Any:
        """The fields of `schema` (a pydantic model class or a JSON object schema) filled from
        `text`: a validated model instance, or a dict checked by the grammar."""
        text = check_query(text)
        is_model = isinstance(schema, type) and hasattr(schema, "model_validate")
        if is_model:
            spec = dataclasses.replace(from_pydantic(schema), name=EXTRACT_TOOL,
                                       description=EXTRACT_DESCRIPTION)
        else:
            spec = from_dict({"name": EXTRACT_TOOL, "description": EXTRACT_DESCRIPTION,
                              "parameters": schema})
        grammar, content = (None, self.planner.compile([spec], require_call=True)) \
            if self.whole_answer else (self.planner.compile([spec]), None)
        options = {"reasoning_budget": 0, "require_call": True, **options}
        # A conversation of its own: extraction leaves the chat conversation untouched.
        envelope = final(self._new_conversation().turn(self.prompt_ids(text, [spec]),
                                            self.config(**options), grammar, content=content))
        calls = envelope["function_calls"]
        if envelope["type"] != "call" or calls[0]["name"] != EXTRACT_TOOL:
            raise ExtractionError(f"the model did not extract (answer type {envelope['type']})")
        arguments = calls[0]["arguments"]
        return schema.model_validate(arguments) if is_model else arguments
