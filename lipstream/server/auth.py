"""Optional bearer token: checked on the WebSocket and the HTTP API when the server has one."""

from __future__ import annotations

import hmac
from collections.abc import Mapping


def extract_token(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The token a request carries: `Authorization: Bearer T` or `?token=T`."""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return query.get("token")


def token_ok(expected: str | None, given: str | None) -> bool:
    """True when no token is configured, or the given one matches (constant-time compare)."""
    if not expected:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
