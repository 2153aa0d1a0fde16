"""API keys: with keys configured, every `/v1/*` route needs `Authorization: Bearer KEY`.

Keys come from `--api-key` (repeatable) and `$NEEDLEPOINT_API_KEY` (`keys_from`). A missing
or wrong key is a 401 in OpenAI's error shape (`invalid_api_key`, what the official client
raises as `AuthenticationError`). `/health`, `/metrics` and the playground stay open: they
serve no model work (the playground's page asks for the key and sends it with its calls).

Keys are compared in constant time: both sides are hashed to SHA-256 first (so the length of
a key is not leaked either) and compared with `hmac.compare_digest`, against every key with
no early exit.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError

ENV_KEY = "NEEDLEPOINT_API_KEY"
PROTECTED_PREFIX = "/v1"


class KeyConfigError(ValueError):
    """An API key that cannot work (empty, or with characters a header cannot carry)."""


def keys_from(cli_keys: Iterable[str] | None, env: Mapping[str, str] | None = None) -> list[str]:
    """The keys of `--api-key` (in order) plus `$NEEDLEPOINT_API_KEY` when set; checked."""
    env = os.environ if env is None else env
    keys = list(cli_keys or [])
    if env.get(ENV_KEY):
        keys.append(env[ENV_KEY])
    for key in keys:
        check_key(key)
    return list(dict.fromkeys(keys))  # duplicates once


def check_key(key: str) -> None:
    if not key or key != key.strip():
        raise KeyConfigError("an API key must be non-empty, without leading or trailing "
                             "spaces")
    if not key.isascii() or not key.isprintable():
        raise KeyConfigError("an API key must be printable ASCII (it travels in an HTTP "
                             "header)")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, "localhost")."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_warning(host: str, port: int, keys: Iterable[str]) -> str | None:
    """The warning printed at start when the server is reachable from other machines and
    anyone there could use it (no key); None otherwise."""
    if list(keys) or is_loopback(host):
        return None
    return (f"needlepoint serve: warning: listening on {host}:{port} without an API key: "
            "anyone who can reach this port can use the model. Pass --api-key KEY or set "
            f"{ENV_KEY}.")


def _digest(value: str | bytes) -> bytes:
    raw = value.encode("latin-1") if isinstance(value, str) else value
    return hashlib.sha256(raw).digest()


class KeyChecker:
    """Holds the accepted keys (as digests) and checks an `Authorization` header value."""

    def __init__(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:
            check_key(key)
        self._digests = [_digest(k) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, authorization: bytes | None) -> bool:
        if authorization is None:
            return False
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return False
        given = _digest(token.strip())
        ok = False
        for digest in self._digests:  # every key, no early exit
            ok |= hmac.compare_digest(given, digest)
        return ok


def unauthorized(has_header: bool) -> ApiError:
    message = ("Incorrect API key provided. Send it as 'Authorization: Bearer KEY'."
               if has_header else
               "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.")
    return ApiError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": 'Bearer realm="needlepoint"'})


def protected(path: str) -> bool:
    return path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")


class ApiKeyMiddleware:
    """Refuses `/v1/*` requests without a valid key (401) before any route runs."""

    def __init__(self, app: ASGIApp, checker: KeyChecker) -> None:
        self.app = app
        self.checker = checker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or not self.checker.enabled
                or not protected(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if self.checker.accepts(header):
            await self.app(scope, receive, send)
            return
        await unauthorized(header is not None).response()(scope, receive, send)
