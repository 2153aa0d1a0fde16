"""The playground with `serve --mcp` in a real browser (issue 29 item 5), as
`test_server_browser.py` drives it (Debian's chromium through Playwright): the MCP tools are
listed with their server, the model's call to one runs on its server, its result goes back
as a tool message and the model answers again (one automatic round per user turn)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO_ROOT
from playwright.sync_api import expect, sync_playwright
from server_helpers import ServerThread

from needlepoint.api.mcp_tools import McpTools
from needlepoint.models.hub import resolve_model_path
from needlepoint.server import create_app

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 60_000


def test_playground_lists_and_runs_mcp_tools() -> None:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")
    with McpTools(REPO_ROOT / "examples" / "mcp.json") as mcp:
        app = create_app(resolve_model_path(None), workers=2, mcp=mcp)
        with ServerThread(app) as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                                 args=["--disable-dev-shm-usage"])
            errors: list[str] = []
            calls: list[dict] = []
            try:
                page = browser.new_page()
                expect.set_options(timeout=TIMEOUT_MS)
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.on("request", lambda r: calls.append(r.post_data_json)
                        if r.url.endswith("/v1/needlepoint/mcp/call") else None)
                page.goto(f"{server.url}/")
                listed = page.locator("#mcp-tools li")
                expect(listed).to_have_count(2)
                expect(listed.first).to_have_text("set_alarm (alarms)")
                page.fill("#tools", "[]")  # only the MCP tools
                page.locator("#tools").dispatch_event("input")
                page.fill("#query", "wake me up at 06:45")
                page.click("#send")
                card = page.locator(".msg.assistant .tool-call").first
                expect(card.locator(".call-name")).to_have_text("set_alarm (MCP: alarms)")
                expect(page.locator(".msg.assistant .stats")).to_have_count(2)
                tool = page.locator(".msg.tool")
                expect(tool).to_have_count(1)  # one automatic round per user turn
                expect(tool).to_contain_text(
                    'result of set_alarm (alarms): {"status":"set","time":"06:45"')
                expect(page.locator("#error")).to_be_hidden()
            finally:
                browser.close()
    assert not errors, errors
    assert calls == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]


def test_playground_shows_a_hand_off_with_its_reason() -> None:
    """Every answer of the demo model is below a threshold of 1.0: the second server's
    answer is shown, marked with the model and the reason."""
    from needlepoint.api.handoff import Handoff

    model = resolve_model_path(None)
    with ServerThread(create_app(model, workers=2)) as big:
        handoff = Handoff(f"{big.url}/v1", model.stem, below=1.0)
        app = create_app(model, workers=2, handoff=handoff)
        with ServerThread(app) as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                                 args=["--disable-dev-shm-usage"])
            try:
                page = browser.new_page()
                expect.set_options(timeout=TIMEOUT_MS)
                page.goto(f"{server.url}/")
                expect(page.locator("#send")).to_be_enabled()
                page.fill("#query", "wake me up at 06:45")
                page.click("#send")
                mark = page.locator(".msg.assistant .handoff")
                expect(mark).to_have_text(f"handed off to {model.stem} (low_confidence)")
                card = page.locator(".msg.assistant .tool-call").first
                expect(card.locator(".call-name")).to_have_text("set_alarm")
            finally:
                browser.close()
