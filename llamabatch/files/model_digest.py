"""A model file's sha256, hashed once per file: run manifests and the disk prefix store name a model by it.

A 5 GB GGUF takes seconds to hash, so the digest is kept in the cache folder keyed by the
file's real path, size and mtime (ns): a file replaced or touched is hashed again, an
unchanged one never is. The cache is best effort: when it cannot be read or written the
file is simply hashed (the digest is never guessed).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .replaced_file import replacing
from .file_hash import sha256_file

CACHE_FILE = "model_sha256.json"


def _cache_path() -> Path:
    from .cache_folder import cache_dir

    return cache_dir() / CACHE_FILE


def file_key(path: str) -> str | None:
    """realpath|size|mtime_ns: what must stay the same for a cached digest to hold."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}|{st.st_size}|{st.st_mtime_ns}"


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_sha256(path: str) -> str | None:
    """The file's sha256, from the cache when its path, size and mtime still match; None when
    the file cannot be read (a fake or missing model: the manifest then says null)."""
    key = file_key(path)
    if key is None:
        return None
    cached = _read_cache().get(key)
    if isinstance(cached, str) and len(cached) == 64:
        return cached
    try:
        digest = sha256_file(path)
    except OSError:
        return None
    if file_key(path) != key:  # changed while hashed: do not cache a digest of a moving file
        return digest
    cache = _cache_path()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        data = _read_cache()
        data[key] = digest
        with replacing(cache) as tmp:  # a name of this process's own: several runs may write at once
            Path(tmp).write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass
    return digest
