"""Whether a prefix store folder can be used, asked before the engine opens it.

The store never fails a request: a folder it can't write makes every save fail quietly
(logged), and the run goes on without it. That is right for a disk that fills up midway,
but a setting that can never work (`--prefix-store ./notes.txt`, `/dev/null`, a path
below a file) then looked like a store that was on. Asked up front, the command says so
once on stderr and runs with the store off. Nothing is created here: the store makes its
folder when it first writes.
"""
from __future__ import annotations

import os
import stat


def unusable_because(root: str | os.PathLike) -> str | None:
    """Why `root` can't be the store's folder ("/x/notes.txt is a file, not a folder"), or None.
    A folder that does not exist yet is fine when the nearest existing one above it is a folder
    this process may write in."""
    probe = os.path.abspath(root)
    while True:
        try:
            mode = os.stat(probe).st_mode
            break
        except (FileNotFoundError, NotADirectoryError):  # not there yet, or below a file: look above
            parent = os.path.dirname(probe)
            if parent == probe:
                return None
            probe = parent
        except OSError as exc:
            return f"{probe}: {exc.strerror or exc}"
    if not stat.S_ISDIR(mode):
        return f"{probe} is {_kind(mode)}, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is a folder this user may not write in"
    return None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a folder"
