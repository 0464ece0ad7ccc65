"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with its status.

The official SDK turns the status into its exception classes (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 409 ConflictError, 413/422 and the rest APIStatusError),
and reads `message` from the body, so every refusal here is one line a person can act on.
"""
from __future__ import annotations

from typing import Any

from ...errors import LlamaBatchError

# OpenAI's error types by status
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error", 409: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error", 416: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class ApiError(LlamaBatchError):
    """A request the service refuses or could not serve: HTTP `status`, one-line `message`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code  # type: ignore[assignment]  # OpenAI's code field (None for most)
        self.headers = dict(headers or {})  # what HTTP asks of some statuses: Allow on a 405, Content-Range on a 416

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(kind: str, object_id: str) -> ApiError:
    # the id is echoed only once it passed the id check (object_ids.py): never raw bytes of the caller's
    return ApiError(404, f"No {kind} found with id '{object_id}'.", code="not_found")
