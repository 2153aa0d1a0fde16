"""The playground in a real browser: Debian's `chromium` driven by Playwright for Python (the
system browser through `executable_path`; nothing downloaded). `.ci/run` installs both.

The server runs on loopback with the bundled demo model and an API key: the page is loaded,
the key entered, the preloaded tools checked, a query sent, and the streamed tool call must
appear as a card (name, arguments, confidence) with the answer's speeds; then a tool result is
entered and the conversation continues. Every request the page makes must go to the server.
`NEEDLEPOINT_PLAYGROUND_SCREENSHOT=PATH` saves a screenshot there (docs/playground.png).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from playwright.sync_api import Page, expect, sync_playwright
from server_helpers import ServerThread

from needlepoint.models.hub import resolve_model_path
from needlepoint.server import create_app

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package (apt-get install chromium)
KEY = "playground-test-key"
TIMEOUT_MS = 60_000


def test_playground_streams_a_tool_call_and_continues() -> None:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")
    tool_names = [t["name"] for t in json.loads((REPO_ROOT / "examples/tools.json").read_text())]
    app = create_app(resolve_model_path(None), workers=2, api_keys=[KEY])
    with ServerThread(app) as server, sync_playwright() as playwright:
        origin = server.url
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=["--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            expect.set_options(timeout=TIMEOUT_MS)
            urls: list[str] = []
            errors: list[str] = []
            bodies: list[dict] = []  # the chat requests the page sent
            page.on("request", lambda request: urls.append(request.url))
            page.on("request", lambda request: bodies.append(request.post_data_json)
                    if request.url.endswith("/v1/chat/completions") else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{origin}/")
            run_page(page, tool_names)
            if os.environ.get("NEEDLEPOINT_PLAYGROUND_SCREENSHOT"):
                page.locator("#tools").evaluate("editor => { editor.scrollTop = 0; }")
                page.screenshot(path=os.environ["NEEDLEPOINT_PLAYGROUND_SCREENSHOT"])
            controls(page)
        finally:
            browser.close()
    assert not errors, errors
    assert urls and all(u.startswith(origin + "/") for u in urls), urls
    assert len(bodies) == 3
    first, result, plain = bodies
    assert first["stream"] is True and first["temperature"] == 0
    assert first["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in first["tools"]] == tool_names
    assert first["messages"] == [{"role": "user", "content": "wake me up at 06:45"}]
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "tool"]
    call_id = result["messages"][1]["tool_calls"][0]["id"]
    assert result["messages"][2]["tool_call_id"] == call_id
    assert plain["tool_choice"] == "none" and plain["temperature"] == 0.7
    assert plain["messages"] == [{"role": "user", "content": "hello there"}]  # a new chat


def run_page(page: Page, tool_names: list[str]) -> None:
    # Without the key the server refuses the page's calls, and the page says so.
    expect(page.locator("#error")).to_contain_text("API key")
    expect(page.locator("#send")).to_be_disabled()
    page.fill("#api-key", KEY)
    page.locator("#api-key").dispatch_event("change")
    expect(page.locator("#model")).to_have_text(resolve_model_path(None).stem)
    expect(page.locator("#error")).to_be_hidden()

    # The tools editor: preloaded with examples/tools.json, validated as you type.
    status = page.locator("#tools-status")
    expect(status).to_have_text(f"✓ {len(tool_names)} tools: " + ", ".join(tool_names))
    expect(page.locator("#tool-choice option")).to_have_count(3 + len(tool_names))
    editor = page.locator("#tools")
    editor.press("ControlOrMeta+End")
    editor.press_sequentially(",")
    expect(status).to_contain_text("✗ JSON")
    expect(page.locator("#send")).to_be_disabled()
    editor.press("Backspace")
    expect(status).to_contain_text("✓")
    expect(page.locator("#send")).to_be_enabled()

    # A query: the streamed tool call appears as a card.
    page.locator("#temperature").fill("0")
    page.fill("#query", "wake me up at 06:45")
    page.click("#send")
    answer = page.locator(".msg.assistant").first
    card = answer.locator(".tool-call").first
    expect(card.locator(".call-name")).to_have_text("set_alarm")
    expect(card.locator(".call-args")).to_contain_text('"time": "06:45"')
    expect(card.locator(".confidence")).to_contain_text("confidence")
    stats = answer.locator(".stats")
    expect(stats).to_contain_text("finish: tool_calls")
    line = stats.inner_text()
    prefill = re.search(r"prefill ([\d,]+) tok/s \((\d+) tokens\)", line)
    decode = re.search(r"decode ([\d,]+) tok/s \((\d+) tokens\)", line)
    chunks = re.search(r"(\d+) chunks", line)
    assert prefill and decode and chunks, line
    assert int(prefill[2]) > 0 and int(decode[2]) > 0
    assert int(prefill[1].replace(",", "")) > 0 and int(decode[1].replace(",", "")) > 0
    # streamed: a role chunk, the call's name, its arguments in pieces, the finish
    assert int(chunks[1]) >= 5, line

    # The tool's result, entered in the page, continues the conversation.
    page.fill(".results input.tool-result", '{"ok": true, "alarm": "06:45"}')
    page.click(".results button.send-results")
    expect(page.locator(".msg.tool")).to_contain_text('result of set_alarm: {"ok": true')
    expect(page.locator(".msg.assistant .stats")).to_have_count(2)
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()


def controls(page: Page) -> None:
    """tool_choice "none" and a temperature, in a new chat: a text answer, no call."""
    page.click("#reset")
    expect(page.locator(".msg")).to_have_count(0)
    page.select_option("#tool-choice", "none")
    page.locator("#temperature").fill("0.7")
    page.fill("#query", "hello there")
    page.click("#send")
    stats = page.locator(".msg.assistant .stats")
    expect(stats).to_have_count(1)
    expect(stats).to_contain_text(re.compile(r"finish: (stop|length)"))
    expect(page.locator(".msg.assistant .tool-call")).to_have_count(0)
