"""The playground's files (`server/playground.py`, `server/static/`) and the stream extension
it reads (the finishing chunk's `"needlepoint"` object). The page itself runs in a real browser
in `test_server_browser.py`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import REPO_ROOT
from server_helpers import (  # noqa: F401 - module-scoped fixtures
    MODEL_ID,
    ServerThread,
    examples,
    model,
    openai_tools,
    server,
    user,
)

from needlepoint.server.playground import FILES, static_file


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:  # noqa: F811
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def test_the_page_and_its_files_are_served(http: httpx.Client) -> None:
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "script-src 'self'" in csp  # no inline script, no other origin
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(referenced) == ["/playground/playground.css", "/playground/playground.js"]
    for path in referenced:
        resp = http.get(path)
        assert resp.status_code == 200
        assert resp.content == static_file(path.rsplit("/", 1)[1])
    assert http.head("/").status_code == 200
    for bad in ["../app.py", "nope.js", "..%2Fapp.py", "%2e%2e%2fapp.py"]:
        assert http.get(f"/playground/{bad}").status_code == 404


def test_nothing_comes_from_the_internet() -> None:
    """No URL of another origin in any shipped file (fonts, scripts, styles, fetches)."""
    for name in FILES:
        text = static_file(name).decode("utf-8")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), name
        assert "@import" not in text and "url(" not in text, name


def test_preloaded_tools_are_the_examples(http: httpx.Client) -> None:
    shipped = http.get("/playground/tools.json").json()
    assert shipped == json.loads((REPO_ROOT / "examples" / "tools.json").read_text())


def test_stream_ends_with_confidence_and_speeds(http: httpx.Client,
                                                examples: list[dict[str, Any]]) -> None:  # noqa: F811
    example = examples[0]
    body = {"model": MODEL_ID, "messages": user(example["query"]),
            "tools": openai_tools(example["tools"]), "stream": True,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishing) == 1
    extension = finishing[0]["needlepoint"]
    assert [c for c in chunks if "needlepoint" in c] == finishing  # only there
    usage = chunks[-1]["usage"]
    timings = extension["timings"]
    assert timings["prefill_tokens"] == usage["prompt_tokens"]
    assert timings["decode_tokens"] == usage["completion_tokens"]
    assert timings["prefill_tps"] == pytest.approx(timings["prefill_tokens"]
                                                   / timings["prefill_s"])
    assert timings["decode_tps"] == pytest.approx(timings["decode_tokens"] / timings["decode_s"])
    assert "confidence" in extension
    # issue 29 item 3: the toy model has no confidence head, so the token measure
    assert extension["confidence_source"] == "tokens" and 0.0 < extension["confidence"] <= 1.0
