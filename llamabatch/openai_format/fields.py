"""Checks on JSON request fields shared by the JSON-lines front ends (`run`'s input lines and
`serve-stdin`'s requests), so both accept and word things the same way."""
from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def json_kind(value: Any) -> str:
    """How a JSON value reads in an error message: 'a string', 'an array', 'null', ..."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def is_request_id(value: Any) -> bool:
    """Ids are non-empty strings or integers: echoed back exactly, so they can be matched."""
    return (isinstance(value, str) and bool(value)) or is_int(value)


def check_prompt(prompt: Any) -> str | list[int]:
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(is_int(t) for t in prompt)):
        return prompt
    raise InvalidRequest(f"prompt must be a string or a list of token ids, got {json_kind(prompt)}")


def check_messages(messages: Any) -> list[dict]:
    """The shape only; roles and contents are checked when the chat template renders them."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest('messages must be a non-empty list of {"role", "content"} objects')
    return messages
