"""BFCL through two OpenAI-compatible servers on the same GGUF: `needlepoint serve` and
llama.cpp's own `llama-server --jinja` (`needlepoint-bench-bfcl --serve`).

    needlepoint-bench-bfcl --serve --category simple_python,irrelevance --limit 20 \
        --out bench/results/bfcl_real.json
    needlepoint-bench-bfcl --serve --engines needlepoint --category live_simple --limit 100 \
        --out bench/results/bfcl_real_live.json

Both servers start on loopback ports with one thread each (`needlepoint serve --model M
--threads 1`, `llama-server --jinja -m M -t 1`) and are stopped at the end, error or not. Each
case is sent as BFCL's generation step gives it (`bfcl_data.prompt_functions`, converted to
tools as BFCL's OpenAI handler does), greedy (temperature 0), one case at a time, no prompt
cache reuse on llama.cpp (`cache_prompt: false`). Modes:

* `forced`: a call is required. needlepoint: the `openai` client with
  `tool_choice="required"`. llama.cpp: its forced mode is the call prefilled plus its grammar,
  since its chat endpoint lets any text come first: the prompt is its `/apply-template`
  rendering of the messages and tools + `"<tool_call>\\n"`, sent to `/completion` with a GBNF
  grammar (llama.cpp's own JSON-schema conversion, `llama_grammar.json_schema_to_gbnf` from
  the sdist, of `{"name": const, "arguments": parameters}` for any of the tools) for
  `call "\\n</tool_call>" ("\\n<tool_call>\\n" call "\\n</tool_call>")*`;
* `auto`: `tool_choice="auto"` on both chat endpoints, nothing prefilled.

`irrelevance`, `live_irrelevance` and `live_relevance` run in auto only (forced always calls).
Per answer: right and BFCL's error type (`bfcl_data.score_detail`), needlepoint's
`confidence` and `call_confidences` (the response's `needlepoint` object), `lost` (finish
reason `length` and no calls), `unparseable` (a call whose arguments are not a JSON object, or
a forced answer with no call that was not cut), seconds (wall, the request).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import bfcl_data, peer_build

AUTO_ONLY = ("irrelevance", "relevance")
PARALLEL_MAX_TOKENS = 512  # up to ~5 calls of ~60 tokens each, with room to spare
MAX_TOKENS = 256


def wants_call(category: str) -> bool:
    """Whether a right answer in `category` has a call (irrelevance: none; a text answer cut
    at the token limit there loses nothing)."""
    return "irrelevance" not in category


CALL_SIGNS = ("<tool_call>", '"name"', "```")


def is_lost(category: str, mode: str, finish: str, calls: list, text: str) -> bool:
    """Calls lost at the token limit: cut (`length`) with no tool calls, where a call is wanted
    and one was begun (forced, or auto text holding a call's marker, fence or `"name"`; a
    prose answer cut in auto loses no call)."""
    return finish == "length" and not calls and wants_call(category) and (
        mode == "forced" or any(sign in text for sign in CALL_SIGNS))


def max_tokens_for(category: str) -> int:
    return PARALLEL_MAX_TOKENS if "parallel" in category else MAX_TOKENS


def modes_for(category: str, modes: tuple[str, ...]) -> tuple[str, ...]:
    return ("auto",) if any(k in category for k in AUTO_ONLY) else modes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
        return response.read()


def post_json(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read())


def _wait_ready(url: str, process: subprocess.Popen, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode} at start")
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {seconds:.0f} s")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def servers(model: Path, engines: tuple[str, ...], threads: int, log_dir: Path):
    """{engine: base URL} for the servers started; every one is stopped on the way out."""
    started: list[subprocess.Popen] = []
    urls: dict[str, str] = {}
    commands = {
        "needlepoint": ([str(Path(sys.executable).parent / "needlepoint"), "serve", "--model",
                         str(model), "--threads", str(threads)], "--port", "/v1/models"),
        "llama.cpp": ([str(peer_build.server_binary()), "--jinja", "-m", str(model),
                       "-t", str(threads), "--host", "127.0.0.1"], "--port", "/health"),
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for engine in engines:
            command, port_flag, probe = commands[engine]
            port = free_port()
            log = open(log_dir / f"{engine}.log", "w", encoding="utf-8")  # noqa: SIM115
            process = subprocess.Popen([*command, port_flag, str(port)], stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            started.append(process)
            urls[engine] = f"http://127.0.0.1:{port}"
            _wait_ready(urls[engine] + probe, process)
        yield urls
    finally:
        for process in started:
            _stop(process)


def llama_grammar_module() -> Any:
    """llama.cpp's JSON-schema-to-GBNF converter, as the sdist ships it (pure Python)."""
    path = peer_build.CACHE / "llama-server" / f"llama_cpp_python-{peer_build.VERSION}" \
        / "llama_cpp" / "llama_grammar.py"
    spec = importlib.util.spec_from_file_location("vendored_llama_grammar", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forced_gbnf(tools: list[dict[str, Any]], converter: Any) -> str:
    """The grammar after a prefilled `<tool_call>\\n`: one or more Qwen/Hermes call blocks."""
    schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                          "arguments": t["parameters"]},
                         "required": ["name", "arguments"]} for t in tools]}
    gbnf = converter.json_schema_to_gbnf(json.dumps(schema))
    return ('root ::= call "\\n</tool_call>" ("\\n<tool_call>\\n" call "\\n</tool_call>")*\n'
            + gbnf.replace("root ::=", "call ::=", 1))


def parse_blocks(text: str) -> list[dict[str, Any]] | None:
    """The calls of `<tool_call>\\n{...}\\n</tool_call>` blocks (text starts inside the first);
    None when a block is not a {name, arguments} object."""
    calls = []
    for block in text.split("<tool_call>"):
        body = block.split("</tool_call>")[0].strip()
        if not body:
            continue
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)
                and isinstance(value.get("arguments", {}), dict)):
            return None
        calls.append({"name": value["name"], "arguments": value.get("arguments", {})})
    return calls


def openai_calls(tool_calls: list[Any] | None) -> tuple[list[dict[str, Any]], bool]:
    """(calls, unparseable) of an OpenAI message's `tool_calls`."""
    calls = []
    for call in tool_calls or []:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except ValueError:
            return [], True
        if not isinstance(arguments, dict):
            return [], True
        calls.append({"name": call.function.name, "arguments": arguments})
    return calls, False


def chat(client: Any, engine: str, messages: list[dict[str, Any]],
         tools: list[dict[str, Any]], mode: str, max_tokens: int) -> dict[str, Any]:
    """One answer through the `openai` client (both engines' auto, needlepoint's forced)."""
    extra = {"cache_prompt": False} if engine == "llama.cpp" else {}
    model = client.models.list().data[0].id
    start = time.perf_counter()
    completion = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=max_tokens,
        tools=[{"type": "function", "function": t} for t in tools],
        tool_choice="required" if mode == "forced" else "auto", extra_body=extra or None)
    seconds = time.perf_counter() - start
    choice = completion.choices[0]
    calls, bad = openai_calls(choice.message.tool_calls)
    ours = (completion.model_extra or {}).get("needlepoint") or {}
    return {"calls": calls, "unparseable_args": bad, "finish": choice.finish_reason,
            "text": (choice.message.content or "")[:300], "seconds": seconds,
            "confidence": ours.get("confidence"),
            "call_confidences": ours.get("call_confidences"),
            "confidence_source": ours.get("confidence_source")}


def llama_forced(url: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 max_tokens: int, converter: Any) -> dict[str, Any]:
    """llama.cpp's forced call: its template's prompt + `<tool_call>\\n`, then its grammar."""
    start = time.perf_counter()
    wrapped = [{"type": "function", "function": t} for t in tools]
    prompt = post_json(url + "/apply-template", {"messages": messages, "tools": wrapped})["prompt"]
    out = post_json(url + "/completion", {
        "prompt": prompt + "<tool_call>\n", "grammar": forced_gbnf(tools, converter),
        "n_predict": max_tokens, "temperature": 0, "cache_prompt": False})
    seconds = time.perf_counter() - start
    text = out.get("content", "")
    calls = parse_blocks(text)
    finish = "length" if out.get("stop_type") == "limit" or out.get("truncated") else "stop"
    return {"calls": calls or [], "unparseable_args": calls is None and finish != "length",
            "finish": finish, "text": text[:300], "seconds": seconds, "confidence": None,
            "call_confidences": None, "confidence_source": None}


def run_case(case: dict[str, Any], category: str, engine: str, mode: str, url: str,
             client: Any, converter: Any) -> dict[str, Any]:
    tools = bfcl_data.to_tools(bfcl_data.prompt_functions(case, category), category)
    messages = bfcl_data.messages_of(case)
    limit = max_tokens_for(category)
    try:
        if engine == "llama.cpp" and mode == "forced":
            answer = llama_forced(url, messages, tools, limit, converter)
        else:
            answer = chat(client, engine, messages, tools, mode, limit)
    except Exception as error:  # a refused schema or a server error: counted, shown
        answer = {"calls": [], "unparseable_args": True, "finish": "error",
                  "text": f"{type(error).__name__}: {error}"[:300], "seconds": 0.0,
                  "confidence": None, "call_confidences": None, "confidence_source": None}
    right, error_type = bfcl_data.score_detail(case, category, answer["calls"])
    if answer["finish"] == "error":
        right, error_type = False, "server_error"
    lost = is_lost(category, mode, answer["finish"], answer["calls"], answer["text"])
    unparseable = answer["unparseable_args"] or (
        mode == "forced" and not answer["calls"] and not lost)
    if lost:
        error_type = "lost_at_token_limit"
    elif unparseable and answer["finish"] != "error":
        error_type = "unparseable"
    return {"id": case["id"], "category": category, "engine": engine, "mode": mode,
            "right": right, "error_type": error_type, "lost": lost, "unparseable": unparseable,
            "calls": answer["calls"], **{k: answer[k] for k in (
                "finish", "text", "confidence", "call_confidences", "confidence_source")},
            "seconds": round(answer["seconds"], 3)}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (category, engine, mode): n, right, accuracy, lost, unparseable, mean seconds."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["category"], row["engine"], row["mode"]), []).append(row)
    out = []
    for (category, engine, mode), group in groups.items():
        n = len(group)
        out.append({"category": category, "engine": engine, "mode": mode, "n": n,
                    "right": sum(r["right"] for r in group),
                    "accuracy": sum(r["right"] for r in group) / n,
                    "lost": sum(r["lost"] for r in group),
                    "unparseable": sum(r["unparseable"] for r in group),
                    "s_per_case": sum(r["seconds"] for r in group) / n})
    return out


def run(model: Path, categories: list[str], limit: int | None, engines: tuple[str, ...],
        modes: tuple[str, ...], threads: int, out: Path | None, log: Any = print) -> dict:
    """Every case of every category through every engine and mode; writes `out` as it goes."""
    import openai

    from needlepoint import CALIBRATION

    converter = llama_grammar_module() if "llama.cpp" in engines else None
    report: dict[str, Any] = {
        "model": str(model), "threads": threads, "engines": list(engines),
        "modes": list(modes), "limit": limit, "load_before": os.getloadavg(),
        "machine": bfcl_machine(), "calibration": {"slope": CALIBRATION.slope,
                                                   "offset": CALIBRATION.offset},
        "rows": [], "summary": []}
    # a SIGTERM (a stopped run) unwinds like Ctrl-C, so the servers are stopped too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    log_dir = Path(tempfile.mkdtemp(prefix="bfcl_servers_"))  # the servers' own logs
    log(f"server logs in {log_dir}")
    with servers(model, engines, threads, log_dir) as urls:
        clients = {e: openai.OpenAI(base_url=u + "/v1", api_key="none", timeout=600,
                                    max_retries=0) for e, u in urls.items()}
        # case k of every category, then case k + 1: a run stopped early has the same first
        # N cases (give or take one) in every category
        cases = {c: bfcl_data.load_cases(c, limit) for c in categories}
        for k in range(max(len(v) for v in cases.values())):
            for category in categories:
                if k >= len(cases[category]):
                    continue
                for mode in modes_for(category, modes):
                    for engine in engines:
                        row = run_case(cases[category][k], category, engine, mode,
                                       urls[engine], clients[engine], converter)
                        report["rows"].append(row)
                        log(f"{category} {k + 1}/{len(cases[category])} {engine} {mode} "
                            f"right={row['right']} conf={row['confidence']} "
                            f"{row['error_type']} {row['seconds']:.1f}s", flush=True)
                report["summary"] = summarise(report["rows"])
                report["load_after"] = os.getloadavg()
                if out is not None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


def bfcl_machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs"
