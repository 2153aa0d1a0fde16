"""The load benchmark's phases, each against one running server (`bench/load.py`):

* `scaling`: aggregate decode tokens/s of N clients (1, then 16) looping text requests with
  a fixed `max_tokens` (short prompts, so the time is decode time);
* `ttft`: time to the first streamed chunk of a new request, alone and while 15 others
  decode long answers;
* `soak`: many clients (64) for a fixed time on tool-calling requests from the eval set, every
  answer checked against the one the same request got alone, RSS sampled every second.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import openai

from .load_memory import heap_sample, loadavg, summary
from .load_server import Server, health, one_request, percentile


def text_request(query: str, max_tokens: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": query}], "tool_choice": "none",
            "max_tokens": max_tokens}


async def _loop(client: openai.AsyncOpenAI, model: str, requests: list[dict[str, Any]],
                stop: Callable[[], bool], start: int, step: int, record: Callable) -> None:
    i = start
    while not stop():
        request = requests[i % len(requests)]
        i += step
        try:
            record(await one_request(client, model, request, stream=False), request)
        except (openai.APIStatusError, openai.APIConnectionError, openai.APITimeoutError) as e:
            record(e, request)


async def scaling(client: openai.AsyncOpenAI, model: str, queries: list[str], clients: int,
                  duration: float, max_tokens: int) -> dict[str, Any]:
    """`clients` clients loop fixed-length text requests for `duration` s."""
    requests = [text_request(q, max_tokens) for q in queries]
    before = await health(client)
    tokens, done, errors = 0, 0, Counter()
    deadline = time.monotonic() + duration

    def record(result: Any, _: dict) -> None:
        nonlocal tokens, done
        if isinstance(result, Exception):
            errors[type(result).__name__] += 1
            return
        tokens += result[2]
        done += 1

    began = time.monotonic()
    await asyncio.gather(*(_loop(client, model, requests, lambda: time.monotonic() > deadline,
                                 k, clients, record) for k in range(clients)))
    elapsed = time.monotonic() - began
    after = await health(client)
    return {"clients": clients, "requests": done, "tokens": tokens, "seconds": elapsed,
            "tokens_per_s": tokens / elapsed, "errors": dict(errors),
            "mean_batch": _mean_batch(before, after)}


async def ttft(client: openai.AsyncOpenAI, model: str, probes: list[dict[str, Any]],
               queries: list[str], background: int, long_tokens: int,
               rounds: int = 1) -> dict[str, Any]:
    """Time to the first token of new requests, one at a time: each probe is a streamed
    tool-calling request with `max_tokens` 1, so its first chunk comes once its prompt is
    prefilled and its first token chosen. Per round: every probe alone, then every probe
    while `background` clients decode `long_tokens`-token text answers (alternating, so both
    see the same machine)."""
    probes = [{**request, "max_tokens": 1} for request in probes]
    long_requests = [text_request(q, long_tokens) for q in queries]

    async def probe_all() -> list[float]:
        times = []
        for request in probes:
            first, _, _ = await one_request(client, model, request, stream=True)
            times.append(first)
        return times

    await probe_all()  # warm-up (grammars, caches)
    alone: list[float] = []
    loaded: list[float] = []
    ratios = []
    for _ in range(rounds):
        alone_now = await probe_all()
        stop = asyncio.Event()
        busy = [asyncio.ensure_future(_loop(client, model, long_requests, stop.is_set, k,
                                            background, lambda *_: None))
                for k in range(background)]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until all of them are decoding
            live = (await health(client)).get("scheduler", {}).get("live_sessions")
            if live is None or live >= background:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        loaded_now = await probe_all()
        stop.set()
        await asyncio.gather(*busy)
        alone += alone_now
        loaded += loaded_now
        ratios.append(percentile(loaded_now, 50) / percentile(alone_now, 50))
    return {"probes": len(probes), "rounds": rounds, "background": background,
            "alone_p50_s": percentile(alone, 50), "loaded_p50_s": percentile(loaded, 50),
            "loaded_p90_s": percentile(loaded, 90), "round_ratios": ratios,
            "ratio": percentile(ratios, 50), "alone": alone, "loaded": loaded}


async def soak(client: openai.AsyncOpenAI, model: str, server: Server,
               requests: list[dict[str, Any]], clients: int, duration: float) -> dict[str, Any]:
    """`clients` clients for `duration` s; every 4th request streamed; answers checked."""
    reference, unloaded = [], []  # each request's answer alone, before any load
    for request in requests:
        seconds, calls, _ = await one_request(client, model, request, stream=False)
        reference.append(calls)
        unloaded.append(seconds)
    before = await health(client)
    latencies: list[float] = []
    first_chunks: list[float] = []
    errors: Counter[str] = Counter()
    wrong = tokens = 0
    rss: list[tuple[float, int]] = []  # (seconds since the start, bytes), every second
    samples: list[dict[str, float]] = []  # every 10 s: heap figures, load average
    deadline = time.monotonic() + duration

    async def client_loop(k: int) -> None:
        nonlocal wrong, tokens
        i = k
        while time.monotonic() < deadline:
            index, stream = i % len(requests), i % 4 == 3
            i += clients
            start = time.perf_counter()
            try:
                first, calls, n = await one_request(client, model, requests[index], stream)
            except openai.APIStatusError as error:
                errors[f"HTTP {error.status_code}"] += 1
                continue
            except (openai.APIConnectionError, openai.APITimeoutError) as error:
                errors[type(error).__name__] += 1
                continue
            latencies.append(time.perf_counter() - start)
            if stream:
                first_chunks.append(first)
            tokens += n
            wrong += calls != reference[index]

    async def sample_rss() -> None:
        async with httpx.AsyncClient(timeout=60.0) as http:
            while (now := time.monotonic()) < deadline:
                if value := server.rss():
                    rss.append((now - began, value))
                if len(rss) % 10 == 1:
                    heap = await heap_sample(http, server.base_url.removesuffix("/v1"))
                    samples.append({"t": now - began, "loadavg": loadavg(), **heap})
                await asyncio.sleep(1.0)

    began = time.monotonic()
    await asyncio.gather(sample_rss(), *(client_loop(k) for k in range(clients)))
    elapsed = time.monotonic() - began  # the load, plus draining what was in flight
    state = await health(client)
    return {
        "clients": clients, "load_s": duration, "duration_s": elapsed,
        "unloaded_latency_p50_s": percentile(unloaded, 50),
        "requests_ok": len(latencies), "requests_per_s": len(latencies) / elapsed,
        "completion_tokens_per_s": tokens / elapsed,
        "latency_p50_s": percentile(latencies, 50), "latency_p99_s": percentile(latencies, 99),
        "stream_ttft_p50_s": percentile(first_chunks, 50),
        "stream_ttft_p99_s": percentile(first_chunks, 99),
        "errors": dict(errors), "wrong_answers": wrong, "distinct_requests": len(requests),
        "rss_max_sampled_mib": max((v for _, v in rss), default=0) / 2**20,
        "rss_every_10s_mib": [round(v / 2**20) for _, v in rss[::10]],
        "memory": summary(rss, samples), "samples_every_10s": samples,
        "peak_in_flight": state.get("peak_in_flight"),
        "mean_batch": _mean_batch(before, state),
    }


def _mean_batch(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """Sessions per engine step between two /health readings (None without batching)."""
    old, new = before.get("scheduler"), after.get("scheduler")
    if not old or not new or new["steps"] == old["steps"]:
        return None
    return (new["sessions_stepped"] - old["sessions_stepped"]) / (new["steps"] - old["steps"])
