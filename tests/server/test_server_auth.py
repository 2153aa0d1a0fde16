"""API keys (`server/auth.py`): with keys set, every `/v1/*` route needs `Authorization: Bearer
KEY` and answers 401 in OpenAI's error shape otherwise; `/health` stays open; `--api-key`
(repeatable) and `$NEEDLEPOINT_API_KEY` configure it; binding beyond loopback without a key
prints a warning at start. Driven with the official `openai` client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_helpers import (  # noqa: F401 - module-scoped fixtures
    MODEL_ID,
    ServerThread,
    calls_of,
    check_error,
    collect_stream,
    examples,
    model,
    openai_tools,
    user,
)

from needlepoint.server import auth, create_app
from needlepoint.server import cli as server_cli

KEYS = ["key-one-7f3a", "second key 9b2c"]


@pytest.fixture(scope="module")
def keyed(model: Any) -> Iterator[ServerThread]:  # noqa: F811
    app = create_app(model, workers=2, model_name=MODEL_ID, api_keys=KEYS)
    with ServerThread(app) as running:
        yield running


def with_key(server: ServerThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_every_key_is_accepted(keyed: ServerThread, examples: list[dict[str, Any]]) -> None:  # noqa: F811
    example = examples[0]
    for key in KEYS:
        client = with_key(keyed, key)
        assert [m.id for m in client.models.list().data] == [MODEL_ID]
        out = client.chat.completions.create(model=MODEL_ID, messages=user(example["query"]),
                                             tools=openai_tools(example["tools"]))
        streamed = collect_stream(client.chat.completions.create(
            model=MODEL_ID, messages=user(example["query"]),
            tools=openai_tools(example["tools"]), stream=True))
        assert streamed["calls"] == calls_of(out.choices[0].message)
        assert streamed["calls"], "the example asks for a call"


@pytest.mark.parametrize("key", ["wrong", KEYS[0] + "x", KEYS[0][:-1], KEYS[0].upper()])
def test_a_wrong_key_is_401(keyed: ServerThread, key: str) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        with_key(keyed, key).models.list()
    check_error(err.value, 401, code="invalid_api_key")
    assert err.value.body["type"] == "invalid_request_error"
    assert "Incorrect API key" in err.value.body["message"]


def test_every_v1_route_needs_the_key(keyed: ServerThread) -> None:
    body = {"model": MODEL_ID, "messages": user("hi")}
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        for method, path, json_body in [
            ("GET", "/v1/models", None),
            ("GET", f"/v1/models/{MODEL_ID}", None),
            ("POST", "/v1/chat/completions", body),
            ("POST", "/v1/needlepoint/complete", {"text": "wake me up at 7"}),
            ("GET", "/v1/no-such-route", None),  # 401 before 404: nothing is revealed
            ("GET", "/v1", None),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": f"Basic {KEYS[0]}"},
                            {"Authorization": KEYS[0]}, {"Authorization": "Bearer"}):
                resp = http.request(method, path, json=json_body, headers=headers)
                assert resp.status_code == 401, (method, path, headers)
                error = resp.json()["error"]
                assert error["code"] == "invalid_api_key" and error["param"] is None
                assert resp.headers["www-authenticate"].startswith("Bearer")
        auth_ok = {"Authorization": f"Bearer {KEYS[1]}"}
        assert http.get("/v1/no-such-route", headers=auth_ok).status_code == 404
        assert http.get("/v1/models", headers={"authorization": f"bearer {KEYS[0]}"}) \
            .status_code == 200  # the scheme is case-insensitive (RFC 7235)


def test_health_metrics_and_page_stay_open(keyed: ServerThread) -> None:
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        assert http.get("/health").json()["status"] == "ok"
        assert http.get("/metrics").status_code == 200
        assert http.get("/").status_code == 200


def test_missing_key_message(keyed: ServerThread) -> None:
    # the openai client always sends a key: a bare request sends none
    resp = httpx.get(f"{keyed.url}/v1/models", timeout=30)
    assert resp.status_code == 401
    error = resp.json()["error"]
    assert error["code"] == "invalid_api_key" and "didn't provide an API key" in error["message"]


def test_without_keys_everything_is_open(model: Any) -> None:  # noqa: F811
    with ServerThread(create_app(model, workers=1, model_name=MODEL_ID)) as server:
        assert [m.id for m in with_key(server, "anything").models.list().data] == [MODEL_ID]


def test_keys_compare_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured key is compared with `hmac.compare_digest` (no early exit), on
    digests of equal length whatever the key's length."""
    seen: list[tuple[int, int]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    checker = auth.KeyChecker(["short", "a much longer key than that", "k3"])
    assert checker.accepts(b"Bearer short")  # the first key matches; all are still compared
    assert seen == [(32, 32)] * 3
    seen.clear()
    assert not checker.accepts(b"Bearer " + b"x" * 500)
    assert seen == [(32, 32)] * 3
    assert not checker.accepts(None) and not checker.accepts(b"Bearer")
    assert not checker.accepts(b"Token short")


def test_keys_from_flags_and_environment() -> None:
    assert auth.keys_from(["a", "b"], env={}) == ["a", "b"]
    assert auth.keys_from(None, env={"NEEDLEPOINT_API_KEY": "env-key"}) == ["env-key"]
    assert auth.keys_from(["a"], env={"NEEDLEPOINT_API_KEY": "env-key"}) == ["a", "env-key"]
    assert auth.keys_from(["a", "a"], env={"NEEDLEPOINT_API_KEY": "a"}) == ["a"]
    assert auth.keys_from(None, env={"NEEDLEPOINT_API_KEY": ""}) == []  # unset in effect
    for bad in ["", " padded", "tab\tkey", "ключ"]:
        with pytest.raises(auth.KeyConfigError):
            auth.keys_from([bad], env={})
    with pytest.raises(auth.KeyConfigError):
        auth.KeyChecker([""])


@pytest.mark.parametrize("host,warns", [
    ("0.0.0.0", True), ("::", True), ("192.168.1.10", True), ("example.org", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("[::1]", False),
    ("localhost", False),
])
def test_exposure_warning(host: str, warns: bool) -> None:
    warning = auth.exposure_warning(host, 8000, [])
    assert (warning is not None) == warns
    if warns:
        assert host in warning and "--api-key" in warning and "NEEDLEPOINT_API_KEY" in warning
    assert auth.exposure_warning(host, 8000, ["k"]) is None


class _Ran(Exception):
    pass


def _fake_run(app: Any, **options: Any) -> None:
    raise _Ran(options["host"], app)


def test_serve_warns_at_start_without_a_key(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", _fake_run)
    monkeypatch.delenv("NEEDLEPOINT_API_KEY", raising=False)
    with pytest.raises(_Ran):
        server_cli.main(["--host", "0.0.0.0", "--port", "8123"])
    assert "warning: listening on 0.0.0.0:8123 without an API key" in capsys.readouterr().err
    with pytest.raises(_Ran):
        server_cli.main(["--host", "0.0.0.0", "--api-key", "k"])
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setenv("NEEDLEPOINT_API_KEY", "from-env")
    with pytest.raises(_Ran) as ran:
        server_cli.main(["--host", "0.0.0.0"])
    assert "warning" not in capsys.readouterr().err
    app = ran.value.args[1]
    with ServerThread(app) as server:  # the environment's key is the one required
        with pytest.raises(openai.AuthenticationError):
            with_key(server, "k").models.list()
        assert [m.id for m in with_key(server, "from-env").models.list().data]


def test_serve_refuses_an_empty_key(capsys: pytest.CaptureFixture[str]) -> None:
    from needlepoint.command import main

    assert main(["serve", "--api-key", ""]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "API key" in err and "Traceback" not in err
