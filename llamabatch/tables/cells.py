"""One cell's checks: text enough for a prompt, not oversized, valid UTF-8; and its JSON form for
the record's kept columns. Pure functions."""
from __future__ import annotations

import base64
import datetime
import decimal
import math
from typing import Any

from .errors import INVALID_ROW, RowProblem

# A cell over this is refused as its row's error: no context window holds a prompt near it, and
# a table output would carry it along (the example: a 100 MB cell).
MAX_CELL_BYTES = 16 * 1024 * 1024

# Values str.format renders as they are (so `{price:.2f}` works); anything else is not text.
SCALARS = (str, int, float, decimal.Decimal, datetime.date, datetime.time, datetime.timedelta)


def kind_of(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "binary"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a struct/map"
    return type(value).__name__


def check_size(column: str, value: Any, limit: int = MAX_CELL_BYTES) -> None:
    size = len(value) if isinstance(value, (str, bytes, bytearray)) else 0
    if size > limit:
        raise RowProblem(INVALID_ROW, f"column {column!r} holds {size / 1e6:.1f} MB, over the "
                                      f"{limit / 1e6:.1f} MB a cell may hold")


def check_utf8(column: str, value: str) -> None:
    """CSV text is decoded with surrogateescape: an undecodable byte shows up as a lone surrogate."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = value[exc.start:exc.start + 1].encode("utf-8", "surrogateescape")
        raise RowProblem(INVALID_ROW, f"column {column!r} is not valid UTF-8 (byte 0x{raw[0]:02x} at "
                                      f"character {exc.start})") from None


def template_value(column: str, value: Any) -> Any:
    """A cell as a template field: text and numbers as they are; null and non-text are the row's error."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise RowProblem(INVALID_ROW, f"column {column!r} is null")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, SCALARS):
        return value
    raise RowProblem(INVALID_ROW, f"column {column!r} is {kind_of(value)}, not text")


def json_value(value: Any) -> Any:
    """A cell as it goes into a JSON record (kept columns): JSON scalars stay, bytes become
    base64 text, nested values are converted inside, anything else its str()."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return str(value)
