"""The files of a split GGUF: `name-00001-of-00003.gguf` and its siblings, which llama.cpp
loads from the first one. Names only: nothing here opens a file."""
from __future__ import annotations

import re
from pathlib import Path

SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def shard_info(path: str | Path) -> tuple[int, int] | None:
    """(index, count) for `name-00002-of-00003.gguf`, else None."""
    match = SHARD_RE.search(str(path))
    return (int(match.group(1)), int(match.group(2))) if match else None


def shards_of(first: Path) -> tuple[str, ...]:
    """Every file of the split GGUF whose first shard is `first` (just `first` if not split)."""
    match = SHARD_RE.search(first.name)
    if not match:
        return (str(first),)
    count, stem = int(match.group(2)), SHARD_RE.sub("", first.name)
    return tuple(str(first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf")) for i in range(1, count + 1))
