"""The published API (`/openapi.json`, server/openapi.py) against the server itself:
schemathesis sends generated requests (valid and invalid, fixed seed, bounded count) and
checks there is no 5xx and every response (status, content type, body schema, headers) is as
documented. Plus the document's own promises: no 422, the statuses the server sends, real
200 schemas for both chat endpoints, `text/event-stream`, and 405 with `Allow`."""

# ruff: noqa: F811

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as fixed_seed
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from server_helpers import ServerThread, model  # noqa: F401 (fixture, requested by name)

from needlepoint.server import create_app

EXAMPLES = 12  # per operation: the module takes ~20 s on two idle cores
# Not `positive_data_acceptance`: a request the schema allows may still be refused on meaning
# (a prompt over the context, a tool_call_id on a user message), by design a documented 400.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance, negative_data_rejection,
          unsupported_method, allow_header_conformance]


@pytest.fixture(scope="module")
def api_server(model) -> Iterator[ServerThread]:
    app = create_app(model, workers=2, max_queue=64, model_name="needle3-toy")
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def api_schema(api_server: ServerThread):
    return schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@fixed_seed(22)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_generated_requests_match_the_published_api(case):
    case.call_and_validate(checks=CHECKS, timeout=60)


def test_the_document_says_what_the_server_does(api_server):
    doc = httpx.get(f"{api_server.url}/openapi.json").json()
    text = str(doc)
    assert "422" not in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "HTTPValidationError" not in text
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "404", "413", "429"} <= set(chat)
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    assert chat["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletion"}
    assert chat["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}
    native = doc["paths"]["/v1/needlepoint/complete"]["post"]["responses"]
    assert native["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Envelope"}
    components = doc["components"]["schemas"]
    assert {"choices", "usage", "model"} <= set(components["ChatCompletion"]["properties"])
    assert set(components["ErrorResponse"]["properties"]) == {"error"}


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/chat/completions", "POST"),
    ("PUT", "/v1/needlepoint/complete", "POST"),
    ("POST", "/v1/models", "GET"),
    ("DELETE", "/health", "GET"),
])
def test_a_method_not_served_is_405_with_allow(api_server, method, path, allow):
    response = httpx.request(method, f"{api_server.url}{path}")
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["type"] == "invalid_request_error"
