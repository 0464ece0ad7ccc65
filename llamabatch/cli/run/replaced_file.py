"""Replacing a file all at once: a reader, or a process killed meanwhile, sees the old file or
the whole new one, never part of one (the run's manifest, a finished table)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """Yield a temporary name beside `path` (same folder, so the rename is atomic; this
    process's id in it, so two runs never share one) for the caller to write; when the block
    ends without an exception it is renamed over `path`, otherwise it is removed and the
    exception goes on."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
