"""`Needle`: tool calling in the shape users of `cactus-needle` know.

    needle = needlepoint.Needle(tools=[set_alarm, get_weather])
    needle.complete("wake me at 6:45")   # -> {"type": "call", "function_calls": [...], ...}
    needle.run("wake me at 6:45")        # also executes the functions, feeds results back
    for event in needle.stream("..."):   # ReasoningDelta / TextDelta / ToolCallDelta / Done
        ...

Each `Needle` owns its conversation (session, history); instances never share state (only
the read-only weights, through the explicit `hub.ModelCache`). `complete`/`stream` start a
fresh conversation, `chat` continues the current one, `reset` forgets it.

`auto_date` defaults to False, unlike upstream's packaged API: the bundled demo model was
trained without a system turn and answers worse with one. Pass `auto_date=True` to add
upstream's `date: YYYY-MM-DD Ddd HH:MM` fact.

`extract(text, schema)` is one forced tool call whose parameters are the schema (the
Needle 3 vocabulary has `<extract>`/`<schema>` markers, but upstream documents no wire
format for them, so we do not guess one).

Tool retrieval (`retrieval`): on a model with a contrastive embedding head (Needle 2), a
conversation whose tool list is longer than `retrieve_threshold` shows the model, and
compiles the grammar for, only the `retrieve_k` tools closest to the first query;
`rank_tools`/`retrieve_tools` expose the ranking.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import NeedlepointError
from ..generation.events import DeltaEvent, Done
from ..generation.grammar import MAX_TOOLS, TokenVocab, ToolCallGrammar
from ..generation.prompt import (
    prompt_ids,
    render_prompt,
    render_system,
    render_tool_results,
    with_date,
)
from ..generation.retrieval import (
    DEFAULT_RETRIEVE_K,
    DEFAULT_RETRIEVE_THRESHOLD,
    RetrievalUnavailableError,
    ToolIndex,
)
from ..generation.sampling import SamplingConfig
from ..generation.turn import GenerationConfig, TurnVocab
from ..models.hub import MODEL_CACHE, ModelCache, load_model
from .conversation import Conversation
from .tools import ToolSpec, from_dict, from_pydantic, tool, tool_specs

__all__ = ["ExtractionError", "Needle", "RetrievalUnavailableError", "tool"]

EXTRACT_TOOL = "extract"
EXTRACT_DESCRIPTION = "Extract the requested fields from the text."
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")
TURN_OPTIONS = ("max_new_tokens", "reasoning_budget")
# Compiled grammars kept per offered subset: a few ms each to build, but a chat app asks
# the same kinds of question again, so recent subsets are worth keeping (bounded).
SUBSET_GRAMMARS = 16


class _TokenVocabCache:
    """The grammar engine's view of a tokenizer (immutable, ~0.2 s to build), built once per
    tokenizer object and shared read-only; entries go away with their tokenizer."""

    def __init__(self) -> None:
        self._vocabs: weakref.WeakKeyDictionary[Any, TokenVocab] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, tokenizer: Any) -> TokenVocab:
        with self._lock:
            vocab = self._vocabs.get(tokenizer)
            if vocab is None:
                vocab = self._vocabs[tokenizer] = TokenVocab.from_tokenizer(tokenizer)
            return vocab


GRAMMAR_VOCABS = _TokenVocabCache()


class ExtractionError(NeedlepointError):
    """The model declined to extract (it answered `[]` or without a call)."""


def jsonable(value: Any) -> Any:
    """A tool's return value as plain JSON data (pydantic models, dataclasses, enums)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, enum.Enum):
        return value.value
    return json.loads(json.dumps(value, default=str))


class Needle:
    """A tool-calling assistant over one Needle model."""

    def __init__(
        self,
        tools: Iterable[Any] = (),
        model: Any = None,
        system: str | Mapping[str, Any] | None = None,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        max_new_tokens: int = 512,
        reasoning_budget: int | None = 256,
        auto_date: bool = False,
        grammar: bool = True,
        max_rounds: int = 3,
        kv_window: int | None = None,
        cache: ModelCache | None = MODEL_CACHE,
        retrieve_k: int | None = DEFAULT_RETRIEVE_K,
        retrieve_threshold: int = DEFAULT_RETRIEVE_THRESHOLD,
    ) -> None:
        self.model = load_model(model, cache)
        self.tokenizer = self.model.tokenizer
        self.tools: list[ToolSpec] = tool_specs(tools)
        self.system = system
        self.auto_date = auto_date
        self.max_rounds = max_rounds
        self.kv_window = kv_window
        self.defaults = {"temperature": temperature, "top_k": top_k, "top_p": top_p,
                         "seed": seed, "max_new_tokens": max_new_tokens,
                         "reasoning_budget": reasoning_budget}
        self.config()  # validate the defaults now, not at the first query
        if retrieve_k is not None and (not isinstance(retrieve_k, int) or retrieve_k < 1):
            raise ValueError(f"retrieve_k must be a positive int or None, got {retrieve_k!r}")
        if not isinstance(retrieve_threshold, int) or retrieve_threshold < 0:
            raise ValueError(f"retrieve_threshold must be an int >= 0, got {retrieve_threshold!r}")
        self.retrieve_k = retrieve_k
        self.retrieve_threshold = retrieve_threshold
        self._index = ToolIndex(self.model, [spec.schema() for spec in self.tools])
        self._offer_memo: tuple[str, list[ToolSpec]] | None = None
        self._vocab = TurnVocab.from_tokenizer(self.tokenizer)
        self._grammar_vocab = GRAMMAR_VOCABS.get(self.tokenizer) if grammar else None
        self._subset_grammars: OrderedDict[tuple[str, ...], ToolCallGrammar | None] = \
            OrderedDict()
        if self.retrieval_active and len(self.tools) > MAX_TOOLS:
            # Only subsets are ever compiled, so the full list may exceed the grammar's tool
            # limit; still check every schema now, not at the first query.
            for spec in self.tools:
                self._compile([spec])
            self._grammar = None
        else:
            self._grammar = self._compile(self.tools)
        self._conversation: Conversation | None = None
        self._turn_grammar: ToolCallGrammar | None = self._grammar  # the conversation's

    # ------------------------------------------------------------------ configuration
    def config(self, **overrides: Any) -> GenerationConfig:
        """The generation settings of one call: the constructor's, with `overrides`."""
        unknown = set(overrides) - set(SAMPLING_OPTIONS) - set(TURN_OPTIONS) - {"require_call"}
        if unknown:
            raise TypeError(f"unknown generation options: {sorted(unknown)}")
        merged = {**self.defaults, **overrides}
        return GenerationConfig(
            sampling=SamplingConfig(**{k: merged[k] for k in SAMPLING_OPTIONS}),
            max_new_tokens=merged["max_new_tokens"],
            reasoning_budget=merged["reasoning_budget"],
            require_call=merged.get("require_call", False),
        )

    def _compile(self, specs: list[ToolSpec]) -> ToolCallGrammar | None:
        if self._grammar_vocab is None:
            return None
        return ToolCallGrammar(self._grammar_vocab, [spec.schema() for spec in specs])

    def _grammar_for(self, specs: list[ToolSpec]) -> ToolCallGrammar | None:
        """The grammar for the tools offered in a conversation: the full list's, or a cached
        subset's (LRU)."""
        if len(specs) == len(self.tools) and self._grammar is not None:
            return self._grammar
        if self._grammar_vocab is None:
            return None
        key = tuple(spec.name for spec in specs)
        if key in self._subset_grammars:
            self._subset_grammars.move_to_end(key)
            return self._subset_grammars[key]
        grammar = self._subset_grammars[key] = self._compile(specs)
        if len(self._subset_grammars) > SUBSET_GRAMMARS:
            self._subset_grammars.popitem(last=False)
        return grammar

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
        return with_date(self.system) if self.auto_date else render_system(self.system)

    def prompt_ids(self, query: str, specs: list[ToolSpec] | None = None) -> list[int]:
        """The first turn's token ids for `query` (BOS, system facts, tools, query); the
        tools are `offered_tools(query)` unless `specs` says otherwise."""
        tools = [spec.schema() for spec in (self.offered_tools(query) if specs is None
                                            else specs)]
        return prompt_ids(self.tokenizer, render_prompt(tools, query, self.system_text()))

    # ------------------------------------------------------------------ turns
    def reset(self) -> None:
        """Forget the conversation (the next `chat` starts a new one)."""
        self._conversation = None

    def stream(self, text: str, **options: Any) -> Iterator[DeltaEvent | Done]:
        """Start a new conversation with `text`; yield events as tokens are decoded."""
        config = self.config(**options)
        specs = self.offered_tools(text)
        # Later turns keep this grammar: the model only ever saw these tools' schemas.
        self._turn_grammar = self._grammar_for(specs)
        self._conversation = Conversation(self.model, self._vocab, kv_window=self.kv_window)
        yield from self._conversation.turn(self.prompt_ids(text, specs), config,
                                           self._turn_grammar)

    def complete(self, text: str, **options: Any) -> dict[str, Any]:
        """Start a new conversation with `text`; return the turn's envelope."""
        return _final(self.stream(text, **options))

    def chat_stream(self, text: str, **options: Any) -> Iterator[DeltaEvent | Done]:
        """Continue the conversation with a user turn (the first one shows the tools)."""
        if self._conversation is None:
            yield from self.stream(text, **options)
            return
        conversation = self._conversation
        ids = conversation.user_turn_ids(text, self.tokenizer)
        yield from conversation.turn(ids, self.config(**options), self._turn_grammar)

    def chat(self, text: str, **options: Any) -> dict[str, Any]:
        """Continue the conversation with a user turn; return its envelope."""
        return _final(self.chat_stream(text, **options))

    def send_tool_results(self, results: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        """Give tool results back as the next user turn (`<tool_result>...</tool_result>`)."""
        if self._conversation is None:
            raise NeedlepointError("no conversation to send tool results to")
        return self.chat(render_tool_results(results), **options)

    # ------------------------------------------------------------------ agent loop
    def execute(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """Run one call's Python function: `{"name", "arguments", "result" | "error"}`."""
        entry: dict[str, Any] = {"name": call["name"], "arguments": call["arguments"]}
        spec = next((s for s in self.tools if s.name == call["name"]), None)
        try:
            if spec is None:
                raise NeedlepointError(f"unknown tool {call['name']!r}")
            entry["result"] = jsonable(spec.call(call["arguments"]))
        except Exception as error:  # a tool's failure is reported to the model, not raised
            entry["error"] = f"{type(error).__name__}: {error}"
        return entry

    def run(self, query: str, **options: Any) -> dict[str, Any]:
        """Answer `query`, executing requested calls and feeding results back, for at most
        `max_rounds` rounds (a round whose calls were all executed already ends the loop).

        Returns the last turn's envelope with `function_calls`/`results` listing every call
        executed (in order), `type` "call" if any ran, `turns` holding each turn's envelope,
        `confidence` the lowest over the turns, and timings summed."""
        envelope = self.complete(query, **options)
        turns, results, done = [envelope], [], set()
        for _ in range(self.max_rounds):
            calls = [c for c in envelope["function_calls"] if _call_key(c) not in done]
            if envelope["type"] != "call" or not calls:
                break
            round_results = [self.execute(call) for call in calls]
            done.update(_call_key(call) for call in calls)
            results.extend(round_results)
            feedback = [{k: v for k, v in r.items() if k != "arguments"} for r in round_results]
            envelope = self.send_tool_results(feedback, **options)
            turns.append(envelope)
        return _summary(turns, results)

    # ------------------------------------------------------------------ extraction
    def extract(self, text: str, schema: Any, **options: Any) -> Any:
        """The fields of `schema` (a pydantic model class or a JSON object schema) filled from
        `text`: a validated model instance, or a dict checked by the grammar."""
        is_model = isinstance(schema, type) and hasattr(schema, "model_validate")
        if is_model:
            spec = dataclasses.replace(from_pydantic(schema), name=EXTRACT_TOOL,
                                       description=EXTRACT_DESCRIPTION)
        else:
            spec = from_dict({"name": EXTRACT_TOOL, "description": EXTRACT_DESCRIPTION,
                              "parameters": schema})
        grammar = self._compile([spec])
        options = {"reasoning_budget": 0, "require_call": True, **options}
        # A conversation of its own: extraction leaves the chat conversation untouched.
        conversation = Conversation(self.model, self._vocab, kv_window=self.kv_window)
        envelope = _final(conversation.turn(self.prompt_ids(text, [spec]),
                                            self.config(**options), grammar))
        calls = envelope["function_calls"]
        if envelope["type"] != "call" or calls[0]["name"] != EXTRACT_TOOL:
            raise ExtractionError(f"the model did not extract (answer type {envelope['type']})")
        arguments = calls[0]["arguments"]
        return schema.model_validate(arguments) if is_model else arguments


def _final(events: Iterator[DeltaEvent | Done]) -> dict[str, Any]:
    envelope = None
    for event in events:
        if isinstance(event, Done):
            envelope = event.envelope
    assert envelope is not None
    return envelope


def _call_key(call: Mapping[str, Any]) -> str:
    return json.dumps([call["name"], call["arguments"]], sort_keys=True)


def _summary(turns: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    last = turns[-1]
    confidences = [t["confidence"] for t in turns if t["confidence"] is not None]
    timings: dict[str, float] = {}
    for turn in turns:
        for key, value in turn["timings"].items():
            timings[key] = timings.get(key, 0) + value
    for rate, tokens, seconds in (("prefill_tps", "prefill_tokens", "prefill_s"),
                                  ("decode_tps", "decode_tokens", "decode_s")):
        timings[rate] = timings[tokens] / timings[seconds] if timings[seconds] > 0 else 0.0
    return {
        **last,
        "type": "call" if results else last["type"],
        "function_calls": [{"name": r["name"], "arguments": r["arguments"]} for r in results]
        if results else last["function_calls"],
        "results": results,
        "reasoning": "\n".join(t["reasoning"] for t in turns if t["reasoning"]),
        "confidence": min(confidences) if confidences else None,
        "timings": timings,
        "turns": turns,
    }

