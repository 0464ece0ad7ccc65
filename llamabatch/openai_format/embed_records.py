"""Embeddings lines of `llamabatch run`: what a line asks for, and the records that answer it.

OpenAI's /v1/embeddings response body, exactly: {"object": "list", "data": [{"object":
"embedding", "index": i, "embedding": [floats] or base64}], "model", "usage": {"prompt_tokens",
"total_tokens"}}; vectors as floats or base64 (llamabatch/openai_format/embed_vectors.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..results import EmbeddingResult
from .embed_vectors import check_encoding, decode_base64, encode  # noqa: F401  (check_encoding, decode_base64: re-exported)

# The /v1/embeddings body fields: `model` and `user` are accepted and ignored (the line runs on
# the loaded model), as for chat and completions lines.
EMBED_BODY_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


@dataclass
class EmbedLine:
    inputs: Any  # checked by the engine (core/embedding.py)
    encoding_format: str = "float"
    dimensions: int | None = None


def embedding_body(result: EmbeddingResult, encoding_format: str, model: str) -> dict[str, Any]:
    n = result.usage.prompt_tokens
    return {"object": "list",
            "data": [{"object": "embedding", "index": e.index, "embedding": encode(e.vector, encoding_format)}
                     for e in result.embeddings],
            "model": model,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def plain_embedding_record(line_id: Any, result: EmbeddingResult, encoding_format: str,
                           echo: dict | None = None, row: int | None = None) -> dict[str, Any]:
    """{"id", "embeddings": [one per input], "pooling", "usage", "timings", "error"} (+ "input"),
    and a table's "row" right after "id", as in a generation record (table_output.py finds it there)."""
    record = {"id": line_id, **({"row": row} if row is not None else {}), **result.to_dict()}
    record["embeddings"] = [encode(v, encoding_format) for v in result.vectors]
    if result.finish_reason == "timeout" and record["error"] is None:
        record["error"] = {"code": "timeout", "message": "the request's timeout passed before it finished"}
    if echo is not None:
        record["input"] = echo
    return record
