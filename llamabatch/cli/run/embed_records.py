"""Embeddings lines of `llamabatch run`: what a line asks for, and the records that answer it.

OpenAI's /v1/embeddings response body, exactly: {"object": "list", "data": [{"object":
"embedding", "index": i, "embedding": [floats] or base64}], "model", "usage": {"prompt_tokens",
"total_tokens"}}. base64 is the vector's little-endian float32 bytes, as OpenAI sends it
(numpy.frombuffer(base64.b64decode(s), dtype="<f4") gives the vector back).
"""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequest
from ...results import EmbeddingResult

ENCODINGS = ("float", "base64")
# The /v1/embeddings body fields: `model` and `user` are accepted and ignored (the line runs on
# the loaded model), as for chat and completions lines.
EMBED_BODY_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


@dataclass
class EmbedLine:
    inputs: Any  # checked by the engine (core/embedding.py)
    encoding_format: str = "float"
    dimensions: int | None = None


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


def embedding_body(result: EmbeddingResult, encoding_format: str, model: str) -> dict[str, Any]:
    n = result.usage.prompt_tokens
    return {"object": "list",
            "data": [{"object": "embedding", "index": e.index, "embedding": encode(e.vector, encoding_format)}
                     for e in result.embeddings],
            "model": model,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def plain_embedding_record(line_id: Any, result: EmbeddingResult, encoding_format: str,
                           echo: dict | None = None) -> dict[str, Any]:
    """{"id", "embeddings": [one per input], "pooling", "usage", "timings", "error"} (+ "input")."""
    record = {"id": line_id, **result.to_dict()}
    record["embeddings"] = [encode(v, encoding_format) for v in result.vectors]
    if result.finish_reason == "timeout" and record["error"] is None:
        record["error"] = {"code": "timeout", "message": "the request's timeout passed before it finished"}
    if echo is not None:
        record["input"] = echo
    return record
