"""Tool-call grammar (needlepoint.grammar) property test: a seeded run walks 240 random tool
sets to completion and validates what comes out with jsonschema (`check_answer()` is
reusable for walks driven by a real model). Shared setup: `grammar_helpers.py`.
"""

from __future__ import annotations

import json
import random
from functools import cache

import jsonschema
import numpy as np
import pytest
from grammar_helpers import CLOSE, IM_END, vocab

from needlepoint.generation.grammar import ToolCallGrammar

# ---------------------------------------------------------------- property test
NAMES = ["get", "get_weather", "get_weather_hourly", "set", "set_alarm", "send_message",
         "play_music", "find", "find_route", "x", "naïve_tool", "a-b.c"]
PATTERNS = ["^[a-z]{1,6}$", "^[0-2][0-9]:[0-5][0-9]$", "^[A-Z][a-z]{0,5}$", "[0-9]+",
            "^(red|green|blue)$", "^\\d{3}-\\d{4}$"]


def _bounds(rng: random.Random, s: dict, keys: tuple[str, str], lo: int,
            chances: tuple[float, float], spread: int) -> dict:
    """`s` with, each by its chance, the lower bound `lo` and an upper bound up to `spread`
    above it (the random draws in the order the generator has always made them)."""
    if rng.random() < chances[0]:
        s[keys[0]] = lo
    if rng.random() < chances[1]:
        s[keys[1]] = lo + rng.randint(0, spread)
    return s


def gen_schema(rng: random.Random, depth: int, defs: dict) -> dict:
    """One random value schema; nesting stops at depth 3."""
    kinds = ["string", "string", "integer", "number", "boolean", "null", "enum", "const",
             "pattern", "nullable"]
    if depth < 3:
        kinds += ["array", "object", "object", "anyOf", "oneOf", "ref"]
    kind = rng.choice(kinds)
    if kind == "string":
        lo = rng.choice([0, 0, 1, 3])
        return _bounds(rng, {"type": "string"}, ("minLength", "maxLength"), lo, (0.5, 0.7), 8)
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind in ("integer", "number"):
        lo = rng.randint(-50, 50)
        s = _bounds(rng, {"type": kind}, ("minimum", "maximum"), lo, (0.6, 0.6), 200)
        if kind == "number" and rng.random() < 0.3:
            s["exclusiveMinimum"] = s.pop("minimum", lo) - 0.5
        return s
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        pool = ["heat", "cool", "auto", "a b", "é", 0, 7, -3, 2.5, True, None, ""]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["on", 3, False, None, [1, "x"], {"k": "v"}])}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer", "boolean"]), "null"]}
    if kind == "array":
        s = {"type": "array", "items": gen_schema(rng, depth + 1, defs)}
        return _bounds(rng, s, ("minItems", "maxItems"), rng.randint(0, 2), (0.5, 0.8), 2)
    if kind == "anyOf":
        return {"anyOf": [gen_schema(rng, depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    if kind == "oneOf":  # disjoint branches: overlapping ones are coerced to anyOf (a gap)
        types = rng.sample(["string", "integer", "boolean", "null", "array"], rng.randint(2, 3))
        return {"oneOf": [{"type": t} for t in types]}
    if kind == "ref":
        name = f"d{len(defs)}"
        defs[name] = {}  # reserve the name before recursing
        defs[name] = gen_object(rng, depth + 1, defs)
        return {"$ref": f"#/$defs/{name}"}
    return gen_object(rng, depth + 1, defs)


def gen_object(rng: random.Random, depth: int, defs: dict, most: int = 3) -> dict:
    keys = rng.sample(["city", "n", "when", "tags", "properties", "é", "to", "body", "mode",
                       "x1", "volume"], rng.randint(0, most))
    s = {"type": "object", "properties": {k: gen_schema(rng, depth, defs) for k in keys}}
    s["required"] = [k for k in keys if rng.random() < 0.5]
    if rng.random() < 0.2:
        s["additionalProperties"] = False
    return s


def gen_tools(rng: random.Random) -> list[dict]:
    tools = []
    for name in rng.sample(NAMES, rng.randint(1, 4)):
        defs: dict = {}
        params = gen_object(rng, 0, defs, most=5)
        if defs:
            params["$defs"] = defs
        tools.append({"name": name, "description": "generated", "parameters": params})
    return tools


@cache
def closers() -> tuple[np.ndarray, np.ndarray]:
    """Token preference tiers that steer a long walk to the end: tokens ending a string or a
    container (or a special token), then tokens holding any JSON punctuation."""
    tier1 = np.zeros(vocab().vocab_size, bool)
    tier2 = np.zeros(vocab().vocab_size, bool)
    for i, b in enumerate(vocab().token_bytes):
        tier1[i] = i in vocab().special_ids or (b[-1:] in (b'"', b"]", b"}"))
        tier2[i] = any(c in b for c in b'",:]}')
    return tier1, tier2


def no_whitespace_outside_strings(text: str) -> bool:
    in_string = escape = False
    for c in text:
        if in_string:
            escape, in_string = (False, True) if escape else (c == "\\", c != '"')
        elif c in " \t\r\n":
            return False
        elif c == '"':
            in_string = True
    return True


def random_walk(g: ToolCallGrammar, rng: random.Random, patience: int = 60, cap: int = 1500):
    """Uniform among allowed tokens, except: early on, mostly avoid closing tokens (so walks
    make calls and fill optional keys); after `patience` steps, mostly pick closing tokens,
    then punctuation, so every walk ends."""
    m = g.start()
    tier1, tier2 = closers()
    for step in range(cap):
        if m.is_finished():
            return m
        allowed = m.allowed_mask()
        ids = np.flatnonzero(allowed)
        assert ids.size, f"dead end after {m.text()!r}"
        if step < patience:
            keep_going = np.flatnonzero(allowed & ~tier1)
            if keep_going.size and rng.random() < 0.6:
                ids = keep_going
        else:
            for tier in (tier1, tier2):
                preferred = np.flatnonzero(allowed & tier)
                if preferred.size and rng.random() < 0.9:
                    ids = preferred
                    break
        m.advance(int(ids[rng.randrange(ids.size)]))
    pytest.fail(f"walk did not finish in {cap} steps: {m.text()[:300]!r}")


def check_answer(tools: list[dict], m) -> list[dict]:
    """Everything a finished tool-call answer must satisfy (reusable with a real model):
    compact JSON, declared and distinct names, `name` then `arguments`, arguments valid
    under the tool's schema with keys in schema order; returns the calls."""
    assert m.is_finished() and m.tokens[-2:] == [CLOSE, IM_END]
    text = m.text().decode()
    assert no_whitespace_outside_strings(text), text
    calls = json.loads(text)
    by_name = {t["name"]: t["parameters"] for t in tools}
    names = [c["name"] for c in calls]
    assert len(set(names)) == len(names) and set(names) <= set(by_name), names
    for call in calls:
        assert list(call) == ["name", "arguments"], call
        params, args = by_name[call["name"]], call["arguments"]
        jsonschema.Draft202012Validator(params).validate(args)
        declared = list(params.get("properties", {}))
        assert [k for k in declared if k in args] == list(args), "keys out of schema order"
    return calls


@pytest.mark.parametrize("block", range(8))
def test_property_random_walks_produce_valid_calls(block):
    """30 seeded random tool sets per block (240 in all), one random walk each."""
    for seed in range(block * 30, block * 30 + 30):
        rng = random.Random(seed)
        tools = gen_tools(rng)
        m = random_walk(ToolCallGrammar(vocab(), tools), rng)
        try:
            check_answer(tools, m)
        except (AssertionError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"seed {seed}: {m.text()!r}") from exc
