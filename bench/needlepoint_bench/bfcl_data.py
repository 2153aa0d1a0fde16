"""BFCL data and scoring as the PyPI package `bfcl-eval` ships them (bench/bfcl.py).

* the cases: `bfcl_eval/data/BFCL_v4_{category}.json` (one JSON object a line), answers in
  `possible_answer/` (none for `irrelevance`: any call is wrong there);
* the functions become tools as BFCL's OpenAI handler makes them (`model_handler/utils.py`
  `convert_to_tool`): dots in names become `_` (`math.factorial` -> `math_factorial`), the
  parameters' Gorilla types map to JSON-schema types (`GORILLA_TO_OPENAPI`), `float` gets
  `"format": "float"` and a note in its description;
* scoring is BFCL's own AST checker (`eval_checker/ast_eval/ast_checker.py`). It imports
  `bfcl_eval.constants.model_config`, which pulls in every vendor SDK: that one module is
  stubbed with a mapping whose entry for our model name says `underscore_to_dot=True` (the
  checker then compares against the underscored names, as for OpenAI models).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

MODEL_NAME = "needlepoint-bench"


def package_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bench.bfcl needs the PyPI package bfcl-eval: "
                         "pip install --no-deps bfcl-eval")
    return Path(list(spec.submodule_search_locations)[0])


def _stub_model_config() -> None:
    """`bfcl_eval.constants.model_config` without its vendor SDK imports."""
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return
    config = types.SimpleNamespace(underscore_to_dot=True)
    module = types.ModuleType(name)
    module.MODEL_CONFIG_MAPPING = {MODEL_NAME.replace("_", "/"): config}
    sys.modules[name] = module


def checker() -> Any:
    """BFCL's `ast_checker` function and its `Language` enum."""
    _stub_model_config()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language


def _read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


# A built-in category of two cases in BFCL's format, for a run without bfcl-eval (the smoke
# test, `--category sample`): scored by `sample_score`, their Gorilla types mapped by
# SAMPLE_TYPES, not by BFCL's own checker and table.
SAMPLE = "sample"
SAMPLE_TYPES = {"dict": "object", "string": "string", "integer": "integer", "float": "number",
                "boolean": "boolean", "array": "array"}


def _sample_case(k: int, question: str, name: str, description: str, param: str,
                 param_description: str, truth: list[str]) -> dict:
    """One BFCL-shaped case: a user question, one function of one required string parameter,
    and the accepted values of that parameter."""
    return {"id": f"sample_{k}",
            "question": [[{"role": "user", "content": question}]],
            "function": [{"name": name, "description": description,
                          "parameters": {"type": "dict", "properties": {
                              param: {"type": "string", "description": param_description}},
                              "required": [param]}}],
            "ground_truth": [{name.replace(".", "_"): {param: truth}}]}


SAMPLE_CASES = [
    _sample_case(0, "what is the weather in Paris", "weather.get", "Current weather of a city.",
                 "city", "the city", ["Paris"]),
    _sample_case(1, "set an alarm for 07:30", "set_alarm", "Set an alarm at a time of day.",
                 "time", "HH:MM", ["07:30", "7:30"]),
]


def sample_score(case: dict[str, Any], calls: list[dict[str, Any]]) -> bool:
    """The sample cases' check: the calls name the expected functions in order, each argument
    one of its allowed values (BFCL's ground-truth shape)."""
    expected = case["ground_truth"]
    if len(calls) != len(expected):
        return False
    for call, truth in zip(calls, expected, strict=True):
        ((name, allowed),) = truth.items()
        if call["name"] != name or any(call["arguments"].get(k) not in v
                                       for k, v in allowed.items()):
            return False
    return True


def load_cases(category: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` cases of a category, each with its `ground_truth` (if any)."""
    if category == SAMPLE:
        return copy.deepcopy(SAMPLE_CASES[:limit])
    root = package_dir() / "data"
    cases = _read_lines(root / f"BFCL_v4_{category}.json")
    answers_file = root / "possible_answer" / f"BFCL_v4_{category}.json"
    if answers_file.is_file():
        answers = {a["id"]: a["ground_truth"] for a in _read_lines(answers_file)}
        for case in cases:
            case["ground_truth"] = answers[case["id"]]
    return cases[:limit] if limit is not None else cases


def _openai_types(properties: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type` (Gorilla types -> JSON-schema types, recursively)."""
    for value in properties.values():
        kind = value.get("type")
        if kind is None:
            value["type"] = "string"
            continue
        if kind == "float":
            value["format"] = "float"
            value["description"] = value.get("description", "") + " This is a float type value."
        value["type"] = mapping.get(kind, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _openai_types(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping.get(items.get("type", "string"), "string")
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping.get(items["items"].get("type", "string"),
                                                         "string")
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _openai_types(items["properties"], mapping)
    return properties


def to_tools(functions: list[dict[str, Any]], category: str = "") -> list[dict[str, Any]]:
    """BFCL functions as tool dicts (`convert_to_tool` for OpenAI-style models)."""
    if category == SAMPLE:
        GORILLA_TO_OPENAPI = SAMPLE_TYPES  # noqa: N806 - BFCL's table's name
    else:
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    tools = []
    for item in copy.deepcopy(functions):
        item["name"] = re.sub(r"\.", "_", item["name"])
        parameters = item.setdefault("parameters", {"type": "object", "properties": {}})
        parameters["type"] = "object"
        parameters["properties"] = _openai_types(parameters.get("properties", {}),
                                                 GORILLA_TO_OPENAPI)
        tools.append({"name": item["name"], "description": item.get("description", ""),
                      "parameters": parameters})
    return tools


def messages_of(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's (single-turn) chat messages."""
    return [dict(m) for m in case["question"][0]]


def prompt_functions(case: dict[str, Any], category: str) -> list[dict[str, Any]]:
    """The case's functions as BFCL's generation step gives them to a model
    (`load_dataset_entry`'s language hint: "in Python 3 syntax", and for Java/JavaScript every
    parameter as a string holding the language's literal); the checker gets the plain ones."""
    if category == SAMPLE:
        return copy.deepcopy(case["function"])
    _stub_model_config()
    from bfcl_eval.utils import _func_doc_language_specific_pre_processing

    return _func_doc_language_specific_pre_processing(copy.deepcopy(case["function"]), category)


def language_of(category: str) -> str:
    """The checker's `Language` member name for a category."""
    if category.endswith("javascript"):
        return "JAVASCRIPT"
    return "JAVA" if category.endswith("java") else "PYTHON"


def score_detail(case: dict[str, Any], category: str,
                 calls: list[dict[str, Any]] | None) -> tuple[bool, str | None]:
    """(right, BFCL's error type or None): `irrelevance` wants no call (`irrelevance:called`),
    `relevance` any call (`relevance:no_call`); every other category goes to BFCL's AST
    checker (`no_call` when there is none)."""
    if "irrelevance" in category:
        return (True, None) if not calls else (False, "irrelevance:called")
    if "relevance" in category:
        return (True, None) if calls else (False, "relevance:no_call")
    if not calls:
        return False, "no_call"
    if category == SAMPLE:
        right = sample_score(case, calls)
        return right, None if right else "sample:wrong"
    ast_checker, language = checker()
    output = [{c["name"]: c["arguments"]} for c in calls]
    result = ast_checker(case["function"], output, case["ground_truth"],
                         getattr(language, language_of(category)), category, MODEL_NAME)
    if result["valid"]:
        return True, None
    return False, str(result.get("error_type") or "unknown")


def score(case: dict[str, Any], category: str, calls: list[dict[str, Any]] | None) -> bool:
    """Whether `calls` ([{"name", "arguments"}], None: no parseable call) answer the case
    (`score_detail`)."""
    return score_detail(case, category, calls)[0]
