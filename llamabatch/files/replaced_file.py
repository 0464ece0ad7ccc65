"""Replacing a file all at once: a reader, or a process killed meanwhile, sees the old file or
the whole new one, never part of one (run's manifest, records and tables, bench's report, chat
transcripts, the caches of model digests, slot counts and machine verdicts)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary name beside `path` (same folder, so the rename is atomic; this
    process's id in it, so two runs never share one) for the caller to write; when the block
    ends without an exception it is renamed over `path`, otherwise it is removed and the
    exception goes on.

    A symbolic link is written through: the new file goes beside the link's target and is
    renamed onto it, so the link stays a link (as a file written in place, JSONL output, always
    did) rather than becoming a regular file while its target keeps the old contents."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def sync_folder(folder: str | os.PathLike) -> None:
    """fsync a folder, so that a rename inside it survives a power cut; best effort (some file
    systems cannot open a folder for this)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
