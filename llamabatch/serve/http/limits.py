"""The service's limits: what one caller may send, checked before it costs anything.

Uploads are OpenAI's own Batch API limits (200 MB and 50,000 requests a file); a JSON request
body is bounded in bytes (read in chunks, refused past the bound, never buffered whole first)
and in nesting depth (the bound every JSON line in llamabatch has, less the level of the batch
line it is read as).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...files.json_line import MAX_DEPTH

MAX_UPLOAD_BYTES = 200 * 1000 * 1000  # OpenAI: "up to 200 MB" for a batch input file
MAX_UPLOAD_LINES = 50_000  # OpenAI: "up to 50,000 requests" a batch
MAX_BODY_BYTES = 16 * 1024 * 1024  # a JSON request body (long chat contexts, many embeddings inputs)
# A request body nests at most as deep as a JSON line may (online.py reads it in its batch-line
# shape as an object, not as text one level deeper).
MAX_JSON_DEPTH = MAX_DEPTH
MAX_METADATA_PAIRS = 16  # OpenAI's metadata: 16 pairs, keys up to 64 and values up to 512 characters
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_FILENAME = 255
DEFAULT_LIST_LIMIT = 20  # GET /v1/batches without limit, as OpenAI
MAX_LIST_LIMIT = 100  # OpenAI: limit between 1 and 100
MAX_FILES_LIST_LIMIT = 10_000  # GET /v1/files: OpenAI's default and most
COMPLETION_WINDOWS = {"24h": 24 * 3600}  # the only window OpenAI offers


@dataclass(frozen=True)
class UploadLimits:
    """What one uploaded file may hold (OpenAI's by default; benchmarks of long batches raise them)."""

    max_bytes: int = MAX_UPLOAD_BYTES
    max_lines: int = MAX_UPLOAD_LINES
