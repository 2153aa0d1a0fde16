"""The Berkeley Function Calling Leaderboard on needlepoint and llama.cpp, same GGUF, same prompt.

    needlepoint-bench-bfcl --model smollm2 --category live_simple --limit 40
    needlepoint-bench-bfcl --model smollm2 --category simple_python,irrelevance --limit 30 \
        --out bench/results/bfcl.json
    needlepoint-bench-bfcl --model smollm2 --category live_simple --agreement --limit 20
    needlepoint-bench-bfcl --serve --model qwen2.5-coder-0.5b --category simple_python --limit 25

`--serve` runs the cases through `needlepoint serve` and `llama-server --jinja` with the
`openai` client instead, forced and auto (`bfcl_serve.py`; docs/benchmarks_bfcl.md's top
section). Without it, in process:

Data and scoring are `bfcl-eval`'s (`bench/bfcl_data.py`: the shipped cases, BFCL's OpenAI
handler's tool conversion with dotted names as `_`, BFCL's AST checker). The prompt is the
model's chat format (`formats/chat_format.py`; SmolLM2: its template plus the Hermes-style tool
prompt), rendered once to token ids that both engines are given. Engines, one case at a time,
each from an empty cache (seconds per case include the prefill), `--threads` threads each:

* `needlepoint-auto`: the whole-answer grammar, answering vs calling as the model chooses at
  its first token (`tool_choice="auto"`, generation/route.py); `needlepoint-required`: a call is
  required (`tool_choice="required"`);
* `llama.cpp-free`: llama-cpp-python greedy, no grammar (at most 64 new tokens, the others
  256: it answers in prose from its first token); `llama.cpp-grammar`: its GBNF from
  the JSON schema of the call list (llama.cpp's `json_schema_to_gbnf`), between the markers.

An answer is unparseable when it holds no well-formed `<tool_call>[...]</tool_call>` list
(prose included; `malformed` counts only the answers that began a call and did not finish a
well-formed one); irrelevance cases want no call. `--agreement` instead compares greedy,
unconstrained tokens of needlepoint (float and int8 numerics) with llama.cpp's.
Develop and tune only on live_simple, live_multiple, live_parallel (the issue's rule).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import bfcl_data

ENGINES = ("needlepoint-auto", "needlepoint-required", "llama.cpp-free", "llama.cpp-grammar")
MAX_NEW_TOKENS = 256
FREE_MAX_NEW_TOKENS = 64  # llama.cpp without a grammar writes prose: a call starts early or never


def parse_answer(text: str) -> list[dict[str, Any]] | None:
    """The calls of a `<tool_call>[...]</tool_call>` answer (one object is taken as a list of
    one); None when there is no such block or it is not a list of {name, arguments}."""
    start = text.find("<tool_call>")
    if start < 0:
        return None
    body = text[start + len("<tool_call>"):]
    end = body.find("</tool_call>")
    body = body[:end] if end >= 0 else body
    try:
        value = json.loads(body)
    except ValueError:
        return None
    value = [value] if isinstance(value, dict) else value
    if not isinstance(value, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str)
            and isinstance(c.get("arguments", {}), dict) for c in value):
        return None
    return [{"name": c["name"], "arguments": c.get("arguments", {})} for c in value]


def malformed(answer: dict[str, Any]) -> bool:
    """A call was begun but is not a well-formed call list (cut off, bad JSON, refused
    schema), as opposed to a plain text answer."""
    return answer["calls"] is None and (answer["error"] is not None
                                        or "<tool_call>" in answer["text"])


class Needlepoint:
    """needlepoint on one model through its public API: `Needle.stream_ids` over the
    conversation's ids (the whole-answer grammar), auto and required (`require_call`)."""

    def __init__(self, model: str, numerics: str, threads: int,
                 json_style: str | None = None) -> None:
        import needlepoint

        self.model = needlepoint.load(model, numerics=numerics, threads=threads)
        self.format = self.model.chat_format
        if json_style is not None:  # the calls' JSON separators (docs/api.md "json_style")
            self.format.json_style = json_style

    def ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        return self.format.conversation_ids(messages, tools)

    def run(self, ids: list[int], tools: list[dict[str, Any]], mode: str,
            query: str = "?") -> dict[str, Any]:
        """One turn after `ids`; `query`: the case's user text (what tool retrieval sees)."""
        import needlepoint

        start = time.perf_counter()
        try:
            needle = needlepoint.Needle(tools=tools, model=self.model, cache=None,
                                        max_new_tokens=MAX_NEW_TOKENS, reasoning_budget=None)
            envelope = None
            for event in needle.stream_ids(ids, query or "?", require_call=mode == "required"):
                envelope = getattr(event, "envelope", envelope)
        except Exception as error:  # a schema the grammar engine refuses: counted, shown
            return {"calls": None, "text": "", "error": f"{type(error).__name__}: {error}",
                    "seconds": time.perf_counter() - start}
        assert envelope is not None, "the turn ended without its envelope"
        calls = envelope["function_calls"] if envelope["type"] in ("call", "refuse") else None
        return {"calls": calls, "text": envelope.get("text", ""),
                "error": envelope.get("error"), "seconds": time.perf_counter() - start}

    def greedy(self, ids: list[int], steps: int) -> list[int]:
        session = self.model.session()
        logits = session.prefill(ids)
        out: list[int] = []
        for _ in range(steps):
            token = int(np.argmax(logits))
            out.append(token)
            if token in self.format.end_ids:
                break
            logits = session.step(token)
        return out


def call_gbnf(tools: list[dict[str, Any]]) -> str:
    """llama.cpp's grammar for `<tool_call>[calls]</tool_call>`: its own JSON-schema
    conversion of the call list (at least one call, names limited to the tools)."""
    from llama_cpp import llama_grammar

    items = [{"type": "object", "properties": {"name": {"const": t["name"]},
                                               "arguments": t["parameters"]},
              "required": ["name", "arguments"]} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    gbnf = llama_grammar.json_schema_to_gbnf(json.dumps(schema))
    return 'root ::= "<tool_call>" calls "</tool_call>"\n' + \
        gbnf.replace("root ::=", "calls ::=", 1)


class LlamaCpp:
    """llama-cpp-python on the same GGUF, fed the same token ids."""

    def __init__(self, gguf: Path, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=8192, n_threads=threads,
                         n_threads_batch=threads, verbose=False)

    def run(self, ids: list[int], tools: list[dict[str, Any]], grammar: bool) -> dict[str, Any]:
        from llama_cpp import LlamaGrammar

        self.llm.reset()  # each case and mode from an empty cache, as needlepoint's
        start = time.perf_counter()
        try:
            compiled = LlamaGrammar.from_string(call_gbnf(tools), verbose=False) \
                if grammar else None
        except Exception as error:
            return {"calls": None, "text": "", "error": f"{type(error).__name__}: {error}",
                    "seconds": time.perf_counter() - start}
        limit = MAX_NEW_TOKENS if grammar else FREE_MAX_NEW_TOKENS
        out = self.llm.create_completion(prompt=ids, max_tokens=limit,
                                         temperature=0.0, grammar=compiled)
        text = out["choices"][0]["text"]
        return {"calls": parse_answer(text), "text": text, "error": None,
                "seconds": time.perf_counter() - start}

    def greedy(self, ids: list[int], steps: int, ends: tuple[int, ...]) -> list[int]:
        self.llm.reset()
        out: list[int] = []
        for token in self.llm.generate(ids, top_k=1, temp=0.0, reset=True):
            out.append(int(token))
            if len(out) >= steps or token in ends:
                break
        return out


def run_category(category: str, limit: int | None, ours: Needlepoint, peer: LlamaCpp | None,
                 engines: tuple[str, ...], log: Any = print) -> dict[str, Any]:
    cases = bfcl_data.load_cases(category, limit)
    tallies = {e: {"correct": 0, "unparseable": 0, "malformed": 0, "errors": 0, "seconds": 0.0}
               for e in engines}
    rows = []
    for k, case in enumerate(cases):
        tools = bfcl_data.to_tools(case["function"], category)
        messages = bfcl_data.messages_of(case)
        ids = ours.ids(messages, tools)
        row = {"id": case["id"], "prompt_tokens": len(ids)}
        query = next((m["content"] for m in messages if m["role"] == "user"), "")
        for engine in engines:
            if engine.startswith("needlepoint"):
                answer = ours.run(ids, tools, engine.split("-")[1], query)
            else:
                assert peer is not None, f"{engine} needs llama.cpp"
                answer = peer.run(ids, tools, engine.endswith("grammar"))
            right = bfcl_data.score(case, category, answer["calls"])
            tally = tallies[engine]
            tally["correct"] += right
            tally["unparseable"] += answer["calls"] is None and "irrelevance" not in category
            tally["malformed"] += malformed(answer)
            tally["errors"] += answer["error"] is not None and answer["calls"] is None
            tally["seconds"] += answer["seconds"]
            row[engine] = {"right": right, "calls": answer["calls"],
                           "text": answer["text"][:200], "error": answer["error"],
                           "seconds": round(answer["seconds"], 3)}
        rows.append(row)
        log(f"{category} {k + 1}/{len(cases)} " + " ".join(
            f"{e}={tallies[e]['correct']}" for e in engines))
    n = len(cases)
    summary = {e: {**t, "accuracy": t["correct"] / n, "unparseable_count": t["unparseable"],
                   "unparseable": t["unparseable"] / n, "s_per_case": t["seconds"] / n}
               for e, t in tallies.items()}
    return {"category": category, "cases": n, "summary": summary, "rows": rows}


def agreement(category: str, limit: int | None, model: str, peer: LlamaCpp, threads: int,
              steps: int) -> dict[str, Any]:
    """Greedy unconstrained tokens of float and int8 needlepoint against llama.cpp's."""
    cases = bfcl_data.load_cases(category, limit)
    out: dict[str, Any] = {}
    for numerics in ("float", "int8"):
        ours = Needlepoint(model, numerics, threads)
        first = full = prefix = 0
        for case in cases:
            tools = bfcl_data.to_tools(case["function"])
            ids = ours.ids(bfcl_data.messages_of(case), tools)
            a = ours.greedy(ids, steps)
            b = peer.greedy(ids, steps, ours.format.end_ids)
            first += a[:1] == b[:1]
            full += a == b
            same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                        min(len(a), len(b)))
            prefix += same
        n = len(cases)
        out[numerics] = {"first_token": first / n, "all_tokens": full / n,
                         "mean_agreeing_prefix": prefix / n, "cases": n, "steps": steps}
        print(numerics, out[numerics])
    return out


def serve_main(args: argparse.Namespace) -> None:
    """`--serve`: the real Qwen2.5-Coder GGUF (fetched unless --model is a file) through both
    servers (`bfcl_serve.run`)."""
    from . import bfcl_serve, real_models

    model = Path(args.model)
    if not model.is_file():
        model = real_models.fetch(real_models.REAL_FILES.get(args.model, real_models.QWEN))
    engines = ("needlepoint", "llama.cpp") if args.engines == ",".join(ENGINES) \
        else tuple(e for e in args.engines.split(",") if e)
    if "llama.cpp" in engines:
        from . import peer_build

        peer_build.ensure_llama_server()
    report = bfcl_serve.run(model, args.category.split(","), args.limit, engines,
                            tuple(args.modes.split(",")), args.threads, args.out)
    for s in report["summary"]:
        print(f"| {s['category']} | {s['engine']} | {s['mode']} | {s['right']}/{s['n']} | "
              f"lost {s['lost']} | unparseable {s['unparseable']} | {s['s_per_case']:.2f} s |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a GGUF path or smollm2")
    parser.add_argument("--category", default="live_simple",
                        help="comma-separated BFCL categories (e.g. simple_python,irrelevance)")
    parser.add_argument("--limit", type=int, default=None, help="first N cases per category")
    parser.add_argument("--numerics", default="deploy", help="needlepoint numerics")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--agreement", action="store_true",
                        help="greedy token agreement with llama.cpp (float and int8)")
    parser.add_argument("--steps", type=int, default=24, help="tokens for --agreement")
    parser.add_argument("--json-style", choices=("spaced", "compact"), default=None,
                        help="needlepoint's call JSON separators (default: the format's)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--no-peer", action="store_true",
                        help="needlepoint's engines only, without llama.cpp (with --category "
                        "sample, without bfcl-eval too: what the smoke test runs)")
    parser.add_argument("--serve", action="store_true",
                        help="through `needlepoint serve` and `llama-server --jinja` with the "
                        "openai client (bfcl_serve.py); --engines needlepoint,llama.cpp")
    parser.add_argument("--modes", default="forced,auto", help="--serve: forced and/or auto")
    args = parser.parse_args(argv)
    if args.serve:
        serve_main(args)
        return
    import needlepoint

    gguf = needlepoint.resolve_model_name(args.model)
    if args.no_peer and args.agreement:
        parser.error("--agreement compares with llama.cpp: it cannot run with --no-peer")
    peer = None if args.no_peer else LlamaCpp(gguf, args.threads)
    load = os.getloadavg()
    report: dict[str, Any] = {"model": str(gguf), "threads": args.threads,
                              "numerics": args.numerics, "json_style": args.json_style,
                              "machine": platform.processor()
                              or platform.machine(), "load_before": load, "categories": []}
    if args.agreement:
        report["agreement"] = {c: agreement(c, args.limit, args.model, peer, args.threads,
                                            args.steps) for c in args.category.split(",")}
    else:
        ours = Needlepoint(args.model, args.numerics, args.threads, args.json_style)
        engines = tuple(e for e in args.engines.split(",")
                        if e and not (args.no_peer and e.startswith("llama.cpp")))
        for category in args.category.split(","):
            result = run_category(category, args.limit, ours, peer, engines)
            report["categories"].append(result)
            if args.out is not None:  # after every category: a long run keeps what it did
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
            for engine, s in result["summary"].items():
                print(f"| {category} | {engine} | {s['correct']}/{result['cases']} | "
                      f"{s['accuracy']:.1%} | {s['unparseable']:.1%} | {s['s_per_case']:.2f} |")
    report["load_after"] = os.getloadavg()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
