"""Reading one JSON-lines line without letting its content take anything else down.

Shared by `run`'s line parser (openai_format/lines.py) and serve-stdin's (protocol.py). Python's
json.loads turns some inputs into exceptions that are not JSONDecodeError (a 100,000-deep
`[[[...` is a RecursionError, a 5,000-digit integer a ValueError), and it accepts JSON's
`\\ud800` escapes, which make lone surrogates: strings that can't be encoded as UTF-8, so
they fail later, far from the line (tokenizing, building a grammar). Here each of those is
one `BadJSON` with a message that names the cause, so it becomes that line's error.
"""
from __future__ import annotations

import json
import re
from typing import Any

# Deeper than any real request (a JSON schema rarely nests 20 levels); a fixed limit keeps the
# outcome the same whichever thread parses the line and however deep its stack already is.
MAX_DEPTH = 100


class BadJSON(ValueError):
    """The line is not usable JSON. `code` is invalid_json or invalid_request."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def loads(text: str, whole: str = "", max_depth: int = MAX_DEPTH) -> Any:
    """json.loads, with every way it can fail as BadJSON (message without the line number).
    `whole`: how to name the value when `text` is a whole file ("the file"): positions then
    say the line too, and a lone surrogate at the top or too deep a nesting is said to be in it.
    `max_depth`: the most levels of arrays and objects it may nest."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}" if whole else f"column {exc.colno}"
        raise BadJSON("invalid_json", f"{exc.msg} at {where}") from None
    except RecursionError:
        raise _too_deep(whole or "it", max_depth) from None
    except ValueError as exc:  # int digits limit (and any other conversion the decoder refuses)
        why = str(exc).split(":")[0]
        raise BadJSON("invalid_json", f"a number can't be read ({why})") from None
    problem = _check_value(data, "", whole or "the line", max_depth, whole or "it")
    if problem is not None:
        raise problem
    return data


def _check_value(data: Any, name: str, top: str = "the line", max_depth: int = MAX_DEPTH,
                 nests: str = "it") -> BadJSON | None:
    """Walk the value (iteratively: no recursion on deep input) for depth and lone surrogates.
    `name` is how the value is named in the message ("": `top`, the whole line or file);
    `nests`, what the depth message says nests too deep."""
    stack: list[tuple[Any, str, int]] = [(data, name, 0)]
    while stack:
        value, path, depth = stack.pop()  # depth: how many containers hold this value
        if depth >= max_depth and isinstance(value, (dict, list)):
            return _too_deep(nests, max_depth)
        if isinstance(value, str):
            where = surrogate_at(value)
            if where is not None:
                return BadJSON("invalid_request", f"{path or top} {where}")
        elif isinstance(value, dict):
            for key, item in value.items():
                where = surrogate_at(key)
                if where is not None:
                    return BadJSON("invalid_request", f"a key in {path or top} {where}")
                stack.append((item, _key_path(path, key), depth + 1))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                stack.append((item, f"{path}[{i}]", depth + 1))
    return None


def _too_deep(what: str, max_depth: int) -> BadJSON:
    return BadJSON("invalid_json", f"{what} nests arrays or objects deeper than {max_depth} levels")


_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _key_path(path: str, key: str) -> str:
    """`path.key`, or `path["k\ney"]` for a key that is not a plain name: an error message
    naming where a value is stays one line whatever the keys hold (found by test_fuzz)."""
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def surrogate_at(text: str) -> str | None:
    """None when `text` is valid Unicode (encodable as UTF-8); else what is wrong, for a message."""
    match = _SURROGATE.search(text)
    if match is None:
        return None
    return (f"has a lone surrogate \\u{ord(match.group()):04x} at character {match.start()}: "
            "not valid Unicode text")


def find_surrogate(value: Any, name: str) -> str | None:
    """The first lone surrogate in a nested value (strings, lists, dict keys and values) as a message
    naming where it is ("stop[1] has a lone surrogate ..."), or None. For values that did not come
    through `loads` (library callers)."""
    problem = _check_value(value, name)
    return problem.message if problem is not None and problem.code == "invalid_request" else None


_ID = re.compile(r'"(id|custom_id)"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d{1,18}(?![\d.eE]))')


def sniff_id(text: str, key: str = "id") -> str | int | None:
    """The request id of a line that does not parse, read with a regex where the line states one
    plainly (`"id": "a1"` or `"id": 7`), so its error can still be matched to the request."""
    for match in _ID.finditer(text):
        if match.group(1) != key:
            continue
        raw = match.group(2)
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if isinstance(value, str) and (not value or surrogate_at(value) is not None):
            return None
        return value
    return None
