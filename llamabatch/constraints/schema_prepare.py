"""A request's `json_schema` as every backend gets it: parsed, closed to its listed properties
(schema_closing.py), checked for what no answer can satisfy (schema_checks.py) and for shapes
past what the backends compile (schema_reach.py).

SamplingParams.validate calls it so that every command refuses a bad schema when the request
is read; the backends (llguidance's masks, llama.cpp's converter) call it for the text they
compile. A file's lines mostly share a few schemas, so the outcome of each schema text, the
rewritten text or the error, is kept for the last KEPT texts.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from ..errors import InvalidRequest
from .schema_checks import check_schema
from .schema_closing import close_schema
from .schema_reach import schema_reach_problem

KEPT = 256
_outcomes: OrderedDict[str, tuple[bool, str]] = OrderedDict()  # text -> (ok, rewritten text or error)
_lock = threading.Lock()


def prepared_schema_text(json_schema: dict | str | bool) -> str:
    """The JSON text a backend compiles for `json_schema` (an object, or its JSON text).
    Raises InvalidRequest (one line) for a schema that is not JSON, not a schema, or asks what
    no answer can satisfy."""
    given = json_schema if isinstance(json_schema, str) else _dumps(json_schema)
    with _lock:
        outcome = _outcomes.get(given)
        if outcome is not None:
            _outcomes.move_to_end(given)
    if outcome is None:
        try:
            outcome = (True, _prepare(given))
        except InvalidRequest as exc:
            outcome = (False, str(exc))  # the message, not the exception: its traceback would grow each raise
        with _lock:
            _outcomes[given] = outcome
            while len(_outcomes) > KEPT:
                _outcomes.popitem(last=False)
    ok, text = outcome
    if not ok:
        raise InvalidRequest(text)
    return text


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:  # a library caller's object that is not JSON data
        raise InvalidRequest(f"json_schema must be JSON data: {type(exc).__name__}: {str(exc)[:100]}") from None


def _prepare(text: str) -> str:
    try:
        schema = json.loads(text)  # a copy of its own, for the rewrite to change
    except ValueError as exc:
        raise InvalidRequest(f"json_schema is not valid JSON: {str(exc)[:100]}") from None
    except RecursionError:
        raise InvalidRequest("json_schema nests too deeply to read") from None
    if schema is True:
        return text  # any JSON value
    if schema is False:
        raise InvalidRequest("json_schema is false, which no value matches")
    if not isinstance(schema, dict):
        kind = {list: "an array", str: "a string", int: "a number", float: "a number"}.get(type(schema), "null")
        raise InvalidRequest(f"json_schema must be a JSON object (a schema), got {kind}")
    close_schema(schema)
    check_schema(schema)
    if (problem := schema_reach_problem(schema)) is not None:
        raise InvalidRequest(problem)
    return json.dumps(schema)
