"""How commands write a vector: a JSON list of floats, or OpenAI's base64 (the vector's
little-endian float32 bytes; numpy.frombuffer(base64.b64decode(s), "<f4") reads it back).
Shared by `run` (embeddings records) and `serve-stdin` (embeddings events)."""
from __future__ import annotations

import base64
import struct
from typing import Any

from ..errors import InvalidRequest

ENCODINGS = ("float", "base64")


def check_encoding(value: Any) -> str:
    if value is None:
        return "float"
    if value in ENCODINGS:
        return value
    raise InvalidRequest(f"encoding_format must be float or base64, got {value!r}")


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def decode_base64(text: str) -> list[float]:
    """The vector of a base64 embedding (for tests and readers without numpy)."""
    data = base64.b64decode(text)
    return list(struct.unpack(f"<{len(data) // 4}f", data))
