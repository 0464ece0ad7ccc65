"""Writing one entry so that no reader ever sees it half written.

The bytes go to a tmp file in the entry's own folder (same file system, so the rename is
atomic), are fsynced, and only then renamed to the entry's name: a *.kv file is complete or
absent, even after a crash or kill -9 (then the tmp file stays behind until the next open).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from ..files.replaced_file import sync_folder
from .naming import entry_file, tmp_file


def write_chunks(fd: int, chunks: Iterable[bytes | memoryview]) -> None:
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            view = view[os.write(fd, view):]  # os.write may write less than asked


def write_atomically(folder: Path, key: str, chunks: Iterable[bytes | memoryview]) -> Path:
    """Write folder/<key>.kv from `chunks`; on any OSError nothing is left behind and it re-raises."""
    # 0o700/0o600: KV bytes encode the prompts they were computed from.
    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = folder / tmp_file(key, os.getpid())
    final = folder / entry_file(key)
    # O_EXCL: another store of this same process writing the same entry right now wins.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            write_chunks(fd, chunks)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    sync_folder(folder)
    return final
