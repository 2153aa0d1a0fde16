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

from ..errors import InvalidOptionError, InvalidQueryError, NeedlepointError
from ..generation import prompt as wire
from ..generation.events import DeltaEvent, Done
from ..generation.grammar import MAX_TOOLS, ToolCallGrammar
from ..generation.retrieval import (
    DEFAULT_RETRIEVE_K,
    DEFAULT_RETRIEVE_THRESHOLD,
    RetrievalUnavailableError,
    ToolIndex,
)
from ..generation.sampling import SamplingConfig
from ..generation.turn import GenerationConfig, TurnVocab
from ..models.hub import MODEL_CACHE, ModelCache, load_model
from .agent import AgentMixin
from .conversation import Conversation
from .grammars import (
    GRAMMAR_VOCABS,
    TURN_VOCABS,
    GrammarCache,
    chat_format_of,
    content_schema,
    text_markers,
)
from .history import Turn, answer_room, fitting_replay
from .many import complete_many
from .plan import Plan as _Plan
from .results import annotated, check_rounds, final, jsonable
from .template_chat import answer_plan, assistant_message, template_turn
from .tools import ToolSpec, from_dict, from_pydantic, tool

__all__ = ["ExtractionError", "GRAMMAR_VOCABS", "Needle", "RetrievalUnavailableError",
           "jsonable", "tool"]

EXTRACT_TOOL = "extract"
EXTRACT_DESCRIPTION = "Extract the requested fields from the text."
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")
TURN_OPTIONS = ("max_new_tokens", "reasoning_budget", "require_call", "allow_call", "stop",
                "logprobs", "speculate", "call_threshold")
GRAMMAR_OPTIONS = ("parallel_tool_calls", "response_format")
NO_TOOLS_NOTE = ("no tools were declared, so there is nothing to call: the turn refused at "
                 "once (pass allow_call=False for a plain text answer)")


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
    """A tool-calling assistant over one Needle model (`agent.py`: execute, run, MCP tools,
    hand-off)."""

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
        mcp: Any = None,  # an mcp.json path or dict, or McpTools (issue 29; agent.py)
        handoff: Any = None,  # a Handoff: unsure answers go to a bigger model (handoff.py)
    ) -> None:
        self.model = load_model(model, cache, threads)
        self.tokenizer = self.model.tokenizer
        self.format = chat_format_of(self.model)
        self.whole_answer = text_markers(self.format)  # a template model (answer_grammar.py)
        self.tools: list[ToolSpec] = self._attach(tools, mcp, handoff)
        self.system = system
        self.auto_date = auto_date
        self.max_rounds = check_rounds(max_rounds)
        self.kv_window = kv_window
        self.defaults = {"temperature": temperature, "top_k": top_k, "top_p": top_p,
                         "seed": seed, "max_new_tokens": max_new_tokens,
                         "reasoning_budget": reasoning_budget, "speculate": speculate}
        self.config()  # validate the defaults now, not at the first query
        if retrieve_k is not None and (not isinstance(retrieve_k, int) or retrieve_k < 1):
            raise ValueError(f"retrieve_k must be a positive int or None, got {retrieve_k!r}")
        if not isinstance(retrieve_threshold, int) or retrieve_threshold < 0:
            raise ValueError(f"retrieve_threshold must be an int >= 0, got {retrieve_threshold!r}")
        self.retrieve_k = retrieve_k
        self.retrieve_threshold = retrieve_threshold
        self._index = ToolIndex(self.model, [spec.schema() for spec in self.tools])
        self._offer_memo: tuple[str, list[ToolSpec]] | None = None
        self._vocab = TURN_VOCABS.get(self.format) if self.whole_answer else \
            TurnVocab.from_tokenizer(self.tokenizer)
        self._grammars = GrammarCache(self.tokenizer, tool_grammar=grammar,
                                      chat_format=self.format)
        if grammar:
            GRAMMAR_VOCABS.get(self.tokenizer, self.format)  # built now, not at the first query
        if self.retrieval_active and len(self.tools) > MAX_TOOLS:
            # Only subsets are ever compiled, so the full list may exceed the grammar's tool
            # limit; still check every schema now, not at the first query.
            for spec in self.tools:
                self._compile([spec])
            self._grammar = None
        else:
            self._grammar = self._compile(self.tools)
        self._conversation: Conversation | None = None
        self._turn_specs: list[ToolSpec] = self.tools  # the tools the conversation offers
        self._turn_grammar: ToolCallGrammar | None = self._grammar  # the conversation's
        self._history: list[Turn] = []  # finished turns, for dropping the oldest
        self._messages: list[dict[str, Any]] = []  # a template model's history (OpenAI shape)

    # ------------------------------------------------------------------ configuration
    def config(self, **overrides: Any) -> GenerationConfig:
        """The generation settings of one call: the constructor's, with `overrides`."""
        unknown = set(overrides) - set(SAMPLING_OPTIONS) - set(TURN_OPTIONS)
        if unknown:
            raise TypeError(f"unknown generation options: {sorted(unknown)}")
        merged = {**self.defaults, **overrides}
        return GenerationConfig(
            sampling=SamplingConfig(**{k: merged[k] for k in SAMPLING_OPTIONS}),
            **{k: merged[k] for k in TURN_OPTIONS if k in merged},
        )

    def _compile(self, specs: list[ToolSpec], **flags: bool) -> ToolCallGrammar | None:
        return self._grammars.compile([spec.schema() for spec in specs], **flags)

    def _grammar_for(self, specs: list[ToolSpec], require_call: bool = False,
                     parallel_calls: bool = True) -> ToolCallGrammar | None:
        """The grammar for the tools offered in a conversation: the full list's, or a cached
        one per (subset, flags) (LRU)."""
        if len(specs) == len(self.tools) and self._grammar is not None and \
                not require_call and parallel_calls:
            return self._grammar
        return self._grammars.calls([spec.schema() for spec in specs],
                                    require_call=require_call, parallel_calls=parallel_calls)

    def _plan(self, specs: list[ToolSpec], options: dict[str, Any]) -> _Plan:
        """Split one call's options into the turn config and the constraints it needs."""
        options = dict(options)
        extra = {k: options.pop(k) for k in GRAMMAR_OPTIONS if k in options}
        parallel = extra.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise InvalidOptionError(f"parallel_tool_calls must be true or false, got "
                                     f"{parallel!r}")
        schema = content_schema(extra.get("response_format"))
        if self.whole_answer:
            return answer_plan(self, specs, options, schema, parallel)
        notes: dict[str, Any] = {}
        if not specs and options.get("allow_call", True) and schema is None:
            if options.get("require_call"):
                raise InvalidOptionError("require_call needs at least one tool to call")
            options["reasoning_budget"] = 0  # the only possible call is `[]`: say so now
            notes["note"] = NO_TOOLS_NOTE
        config = self.config(**options)
        grammar = self._grammar_for(specs, config.require_call, parallel)
        content = None
        if schema is not None and not config.require_call:
            content = self._grammars.content(schema, allow_call=config.allow_call and
                                             bool(specs))
        check = None if self._grammars.tool_grammar else [spec.schema() for spec in specs]
        return _Plan(config, grammar, content, check, parallel, notes)

    # ------------------------------------------------------------------ tool retrieval
    @property
    def retrieval_active(self) -> bool:
        """Whether conversations offer only the top `retrieve_k` tools: retrieval is on, the
        model has a contrastive head, and there are more than `retrieve_threshold` tools."""
        return (self.retrieve_k is not None and len(self.tools) > self.retrieve_threshold
                and self._index.available)

    def rank_tools(self, query: str) -> list[tuple[float, dict[str, Any]]]:
        """Every tool's `(cosine similarity to query, schema)`, best first (ties in the
        original order). Raises `RetrievalUnavailableError` without a contrastive head."""
        return [(score, self.tools[i].schema()) for score, i in self._index.ranked(query)]

    def retrieve_tools(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        """The schemas of the `k` tools closest to `query` (default `retrieve_k`, or 5 when
        retrieval is off), best first."""
        k = k if k is not None else (self.retrieve_k or DEFAULT_RETRIEVE_K)
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return [schema for _, schema in self.rank_tools(query)[:k]]

    def offered_tools(self, query: str) -> list[ToolSpec]:
        """The tools a conversation starting with `query` shows the model: all of them, or,
        when `retrieval_active`, the top `retrieve_k` in their original order."""
        if not self.retrieval_active:
            return self.tools
        # The server renders a prompt to check its length, then streams the same query:
        # remember the last answer instead of embedding the query twice.
        if self._offer_memo is None or self._offer_memo[0] != query:
            assert self.retrieve_k is not None
            chosen = self._index.top_k(query, self.retrieve_k)
            self._offer_memo = (query, [self.tools[i] for i in chosen])
        return self._offer_memo[1]

    def system_text(self) -> str:
        system = self.system
        return wire.with_date(system) if self.auto_date else wire.render_system(system)

    def prompt_ids(self, query: str, specs: list[ToolSpec] | None = None) -> list[int]:
        """The first turn's token ids for `query` (BOS, system facts, tools, query); the
        tools are `offered_tools(query)` unless `specs` says otherwise."""
        query = check_query(query)
        tools = [spec.schema() for spec in (self.offered_tools(query) if specs is None
                                            else specs)]
        if self.whole_answer:
            return self.format.first_ids(tools, query, self.system_text())
        text = wire.render_prompt(tools, query, self.system_text())
        return wire.prompt_ids(self.tokenizer, text)

    # ------------------------------------------------------------------ turns
    def reset(self) -> None:
        """Forget the conversation (the next `chat` starts a new one)."""
        self._conversation = None
        self._history = []

    def _turn(self, conversation: Conversation, ids: list[int], plan: _Plan, user: str
              ) -> Iterator[DeltaEvent | Done]:
        events = conversation.turn(ids, plan.config, plan.grammar, content=plan.content,
                                   check_tools=plan.check_tools, parallel_calls=plan.parallel)
        for event in annotated(events, plan.notes):
            if self.whole_answer and isinstance(event, Done):
                self._messages.append(assistant_message(event.envelope))
            yield event
        self._history.append(Turn(user, list(conversation.last_answer)))

    def stream(self, text: str, **options: Any) -> Iterator[DeltaEvent | Done]:
        """Start a new conversation with `text`; yield events as tokens are decoded."""
        text = check_query(text)
        specs = self.offered_tools(text)
        plan = self._plan(specs, options)
        # Later turns keep these tools: the model only ever saw their schemas.
        self._turn_specs = specs
        self._turn_grammar = self._grammar_for(specs)
        self._conversation = Conversation(self.model, self._vocab, kv_window=self.kv_window)
        self._history = []
        self._messages = [{"role": "user", "content": text}]
        yield from self._turn(self._conversation, self.prompt_ids(text, specs), plan, text)

    def stream_ids(self, ids: Sequence[int], query: str, **options: Any
                   ) -> Iterator[DeltaEvent | Done]:
        """Decode one turn after `ids` (a whole conversation as token ids, e.g. a replayed
        client history) on a fresh session, constrained to the tools `query` (the first user
        turn) is offered; the instance's own conversation is left alone."""
        specs = self.offered_tools(check_query(query))
        plan = self._plan(specs, options)
        conversation = Conversation(self.model, self._vocab, kv_window=self.kv_window)
        yield from annotated(conversation.turn(
            list(ids), plan.config, plan.grammar, content=plan.content,
            check_tools=plan.check_tools, parallel_calls=plan.parallel), plan.notes)

    def complete(self, text: str, **options: Any) -> dict[str, Any]:
        """Start a new conversation with `text`; return the turn's envelope."""
        return self._reviewed(True, text, final(self.stream(text, **options)), options)

    complete_many = complete_many  # many first turns decoded as one batch (many.py)

    def chat_stream(self, text: str, **options: Any) -> Iterator[DeltaEvent | Done]:
        """Continue the conversation with a user turn (the first one shows the tools). When
        the context cannot hold it and an answer, the oldest turns are dropped and the
        envelope's `dropped_turns` says how many."""
        text = check_query(text)
        if self._conversation is None:
            yield from self.stream(text, **options)
            return
        if self.whole_answer:
            yield from template_turn(self, [{"role": "user", "content": text}], options)
            return
        plan = self._plan(self._turn_specs, options)
        conversation = self._conversation
        ids = conversation.user_turn_ids(text, self.tokenizer)
        limit = conversation.context_limit
        if limit is not None:
            room = answer_room(limit, plan.config.max_new_tokens)
            if conversation.position - len(conversation.pending) + len(ids) + room > limit:
                m = self._vocab.markers
                dropped, ids = fitting_replay(
                    lambda first: self.prompt_ids(first, self._turn_specs), self.tokenizer,
                    m.im_end, m.eos, self._history, text, limit, room)
                self._history = self._history[dropped:]
                conversation = Conversation(self.model, self._vocab, kv_window=self.kv_window)
                self._conversation = conversation
                plan.notes["dropped_turns"] = dropped
        yield from self._turn(conversation, ids, plan, text)

    def chat(self, text: str, **options: Any) -> dict[str, Any]:
        """Continue the conversation with a user turn; return its envelope."""
        fresh = self._conversation is None
        return self._reviewed(fresh, text, final(self.chat_stream(text, **options)), options)

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
        grammar, content = (None, self._grammars.compile([spec.schema()], require_call=True)) \
            if self.whole_answer else (self._compile([spec]), None)
        options = {"reasoning_budget": 0, "require_call": True, **options}
        # A conversation of its own: extraction leaves the chat conversation untouched.
        conversation = Conversation(self.model, self._vocab, kv_window=self.kv_window)
        envelope = final(conversation.turn(self.prompt_ids(text, [spec]),
                                            self.config(**options), grammar, content=content))
        calls = envelope["function_calls"]
        if envelope["type"] != "call" or calls[0]["name"] != EXTRACT_TOOL:
            raise ExtractionError(f"the model did not extract (answer type {envelope['type']})")
        arguments = calls[0]["arguments"]
        return schema.model_validate(arguments) if is_model else arguments
