"""The sha256 of a file, read in 1 MiB blocks: one function for every place that hashes a model."""
from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike, *, limit: int | None = None) -> str:
    """The hex sha256 of the file (of its first `limit` bytes when given). Raises OSError."""
    digest = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(CHUNK if left is None else min(CHUNK, left))
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()
