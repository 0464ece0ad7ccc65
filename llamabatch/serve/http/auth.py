"""The API key check: `Authorization: Bearer KEY`, compared in constant time (hmac.compare_digest),
before any route runs or any body is read. Without a key (a loopback server; server.py refuses
any other address without one) every request is let through."""
from __future__ import annotations

import hmac
import json
from typing import Any

from .api_errors import ApiError


class BearerAuth:
    """Pure ASGI middleware (streamed responses pass through untouched)."""

    def __init__(self, app: Any, api_key: str | None, open_paths: tuple[str, ...] = ()):
        """`open_paths`: paths answered without the key (GET /health with --health-without-key)."""
        self.app = app
        self.key = api_key.encode("utf-8") if api_key else None
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or self.key is None or scope.get("path") in self.open_paths
                or self._allowed(scope)):
            await self.app(scope, receive, send)
            return
        body = json.dumps(ApiError(401, "Incorrect API key provided: give it as 'Authorization: Bearer KEY' "
                                        "(the key llamabatch serve was started with).",
                                   code="invalid_api_key").body()).encode("utf-8")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: dict) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.partition(b" ")
        ok = hmac.compare_digest(token.strip(), self.key)  # type: ignore[arg-type]
        return scheme.lower() == b"bearer" and ok
