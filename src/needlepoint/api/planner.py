"""What a `Needle` turn is decoded under: the tool/grammar planner.

`TurnPlanner` owns everything that turns tools and per-call options into a `Plan` (the
generation config, the call grammar, the content grammar, the schemas a grammar-less turn is
checked against, notes for the envelope): the default options, the compiled grammars (LRU,
`grammars.py`), the turn vocabulary, and tool retrieval (which tools a conversation offers:
Needle 2's contrastive head past `retrieve_threshold` tools, docs/api.md "Tool retrieval").
It holds no conversation: `chat_state.ChatState` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidOptionError, ToolSchemaError
from ..generation.answer_grammar import AUTO_CALL_THRESHOLD
from ..generation.grammar import MAX_TOOLS, ToolCallGrammar
from ..generation.retrieval import DEFAULT_RETRIEVE_K, ToolIndex
from ..generation.sampling import SamplingConfig
from ..generation.syntaxes import syntax_for
from ..generation.turn_config import GenerationConfig, TurnVocab
from ..models.protocol import ModelProtocol
from .grammars import GRAMMAR_VOCABS, TURN_VOCABS, GrammarCache, content_schema
from .plan import Plan
from .tools import ToolSpec

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")
TURN_OPTIONS = ("max_new_tokens", "reasoning_budget", "require_call", "allow_call", "stop",
                "logprobs", "speculate", "call_threshold")
GRAMMAR_OPTIONS = ("parallel_tool_calls", "response_format")
NO_TOOLS_NOTE = ("no tools were declared, so there is nothing to call: the turn refused at "
                 "once (pass allow_call=False for a plain text answer)")


class TurnPlanner:
    """Tools and options to a turn's `Plan`, for one model and one tool list."""

    def __init__(self, model: ModelProtocol, tools: list[ToolSpec], defaults: dict[str, Any],
                 *, grammar: bool, retrieve_k: int | None, retrieve_threshold: int,
                 chat_format: Any = None) -> None:
        # the model's chat format, or a variant of it (`tool_format`, `template_kwargs`)
        self.format = model.chat_format if chat_format is None else chat_format
        # a template model's call syntax, chosen once (generation/syntaxes.py): whole-answer
        # grammars (answer_grammar.py); None for Needle's wire format
        self.syntax = syntax_for(self.format)
        self.whole_answer = self.syntax is not None
        self.defaults = defaults
        self.config()  # validate the defaults now, not at the first query
        if retrieve_k is not None and (not isinstance(retrieve_k, int) or retrieve_k < 1):
            raise ValueError(f"retrieve_k must be a positive int or None, got {retrieve_k!r}")
        if not isinstance(retrieve_threshold, int) or retrieve_threshold < 0:
            raise ValueError(f"retrieve_threshold must be an int >= 0, got {retrieve_threshold!r}")
        self.retrieve_k = retrieve_k
        self.retrieve_threshold = retrieve_threshold
        self.grammars = GrammarCache(model.tokenizer, tool_grammar=grammar,
                                     chat_format=self.format)
        # a tool whose schema the grammar cannot hold is dropped, not the whole request
        self.tools, self.dropped = self.usable(tools)
        tools = self.tools
        self.index = ToolIndex(model, [spec.schema() for spec in tools])
        self._offer_memo: tuple[str, list[ToolSpec]] | None = None
        self.vocab = TURN_VOCABS.get(self.format) if self.whole_answer else \
            TurnVocab.from_tokenizer(model.tokenizer)
        if grammar:
            GRAMMAR_VOCABS.get(model.tokenizer, self.format)  # built now, not at the first query
        self.grammar: ToolCallGrammar | None
        if self.retrieval_active and len(tools) > MAX_TOOLS:
            # Only subsets are ever compiled, so the full list may exceed the grammar's tool
            # limit (every schema was checked by `usable`).
            self.grammar = None
        else:
            self.grammar = self.grammars.calls([spec.schema() for spec in tools])

    # ------------------------------------------------------------------ options
    def config(self, **overrides: Any) -> GenerationConfig:
        """The generation settings of one call: the defaults, with `overrides`."""
        unknown = set(overrides) - set(SAMPLING_OPTIONS) - set(TURN_OPTIONS)
        if unknown:
            raise TypeError(f"unknown generation options: {sorted(unknown)}")
        merged = {**self.defaults, **overrides}
        return GenerationConfig(
            sampling=SamplingConfig(**{k: merged[k] for k in SAMPLING_OPTIONS}),
            **{k: merged[k] for k in TURN_OPTIONS if k in merged},
        )

    # ------------------------------------------------------------------ grammars
    def compile(self, specs: Sequence[ToolSpec], **flags: bool) -> Any:
        """A fresh call grammar for `specs` (None with the grammar off)."""
        return self.grammars.compile([spec.schema() for spec in specs], **flags)

    def _check(self, specs: Sequence[ToolSpec]) -> None:
        """ToolSchemaError unless the call syntax and the grammar accept these tools."""
        if self.syntax is not None:
            self.syntax.check_tools([spec.schema() for spec in specs])
        # past the grammar's tool limit only subsets are compiled (tool retrieval): each
        # tool alone; without retrieval the limit is refused below
        for group in [specs] if len(specs) <= MAX_TOOLS else [[spec] for spec in specs]:
            self.grammars.calls([spec.schema() for spec in group])  # cached: reused below

    def usable(self, tools: list[ToolSpec]) -> tuple[list[ToolSpec], list[dict[str, str]]]:
        """(the tools a grammar can hold, the dropped ones as {"name", "reason"}): when the
        whole list fails, each tool is tried alone and the failing ones are left out.
        ToolSchemaError when none is usable, or when the tools fail only together (a name
        declared twice)."""
        if not tools:
            return tools, []
        try:
            self._check(tools)
            return tools, []
        except ToolSchemaError as whole:
            kept, dropped = [], []
            for spec in tools:
                try:
                    self._check([spec])
                except ToolSchemaError as error:
                    dropped.append({"name": spec.name, "reason": str(error)})
                else:
                    kept.append(spec)
            if not dropped:
                raise
            if not kept:
                if len(dropped) == 1:
                    raise
                raise ToolSchemaError("no tool is usable: " + "; ".join(
                    f"{d['name']}: {d['reason']}" for d in dropped)) from whole
            return kept, dropped

    def grammar_for(self, specs: Sequence[ToolSpec], require_call: bool = False,
                    parallel_calls: bool = True) -> ToolCallGrammar | None:
        """The grammar for the tools offered in a conversation: the full list's, or a cached
        one per (subset, flags) (LRU)."""
        if len(specs) == len(self.tools) and self.grammar is not None and \
                not require_call and parallel_calls:
            return self.grammar
        return self.grammars.calls([spec.schema() for spec in specs],
                                   require_call=require_call, parallel_calls=parallel_calls)

    def plan(self, specs: Sequence[ToolSpec], options: dict[str, Any]) -> Plan:
        """Split one call's options into the turn config and the constraints it needs."""
        options = dict(options)
        extra = {k: options.pop(k) for k in GRAMMAR_OPTIONS if k in options}
        parallel = extra.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise InvalidOptionError(f"parallel_tool_calls must be true or false, got "
                                     f"{parallel!r}")
        schema = content_schema(extra.get("response_format"))
        if self.whole_answer:
            return self._answer_plan(specs, options, schema, parallel)
        notes = self.notes()
        if not specs and options.get("allow_call", True) and schema is None:
            if options.get("require_call"):
                raise InvalidOptionError("require_call needs at least one tool to call")
            options["reasoning_budget"] = 0  # the only possible call is `[]`: say so now
            notes["note"] = NO_TOOLS_NOTE
        config = self.config(**options)
        grammar = self.grammar_for(specs, config.require_call, parallel)
        content = None
        if schema is not None and not config.require_call:
            content = self.grammars.content(schema, allow_call=config.allow_call and
                                            bool(specs))
        check = None if self.grammars.tool_grammar else [spec.schema() for spec in specs]
        return Plan(config, grammar, content, check, parallel, notes)

    def _answer_plan(self, specs: Sequence[ToolSpec], options: dict[str, Any],
                     schema: dict[str, Any] | None, parallel: bool) -> Plan:
        """A template model's turn plan: one grammar over the whole answer, so answering vs
        calling is the grammar's first choice; no tools, or `allow_call=False`, is a plain
        text answer (with a `response_format`, JSON)."""
        options = {"reasoning_budget": None, "call_threshold": AUTO_CALL_THRESHOLD, **options}
        if not specs and options.get("require_call"):
            raise InvalidOptionError("require_call needs at least one tool to call")
        if not specs:
            options["allow_call"] = False
        config = self.config(**options)
        tools = [spec.schema() for spec in specs]
        content = None
        if schema is not None and not config.require_call:
            content = self.grammars.content(schema, allow_call=config.allow_call, tools=tools,
                                            parallel_calls=parallel)
        elif config.allow_call:
            content = self.grammars.calls(tools, require_call=config.require_call,
                                          parallel_calls=parallel)
        check = None if self.grammars.tool_grammar else tools
        return Plan(config, None, content, check, parallel, self.notes())

    def notes(self) -> dict[str, Any]:
        """What every answer's envelope says about the tools: the ones left out."""
        return {"dropped_tools": [dict(d) for d in self.dropped]} if self.dropped else {}

    # ------------------------------------------------------------------ tool retrieval
    @property
    def retrieval_active(self) -> bool:
        """Whether conversations offer only the top `retrieve_k` tools: retrieval is on, the
        model has a contrastive head, and there are more than `retrieve_threshold` tools."""
        return (self.retrieve_k is not None and len(self.tools) > self.retrieve_threshold
                and self.index.available)

    def rank(self, query: str) -> list[tuple[float, dict[str, Any]]]:
        """Every tool's `(cosine similarity to query, schema)`, best first."""
        return [(score, self.tools[i].schema()) for score, i in self.index.ranked(query)]

    def retrieve(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        """The schemas of the `k` tools closest to `query` (default `retrieve_k`, or 5 when
        retrieval is off), best first."""
        k = k if k is not None else (self.retrieve_k or DEFAULT_RETRIEVE_K)
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return [schema for _, schema in self.rank(query)[:k]]

    def offered(self, query: str) -> list[ToolSpec]:
        """The tools a conversation starting with `query` shows the model: all of them, or,
        when `retrieval_active`, the top `retrieve_k` in their original order."""
        if not self.retrieval_active:
            return self.tools
        # The server renders a prompt to check its length, then streams the same query:
        # remember the last answer instead of embedding the query twice.
        if self._offer_memo is None or self._offer_memo[0] != query:
            assert self.retrieve_k is not None
            chosen = self.index.top_k(query, self.retrieve_k)
            self._offer_memo = (query, [self.tools[i] for i in chosen])
        return self._offer_memo[1]
