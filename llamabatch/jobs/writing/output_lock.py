"""One run per OUTPUT at a time: `OUTPUT.lock`, held with flock while the run lasts.

Two runs appending to one OUTPUT would interleave records and break "one record per id".
flock is released by the kernel when the process ends however it ends (kill -9 included),
so a stale lock file never blocks the next run. The file is removed on a clean release;
a run that locked a file another run just removed checks that its path still names the
inode it locked, and tries again if not.
"""
from __future__ import annotations

import fcntl
import os

from ...errors import JobFileError

SUFFIX = ".lock"


class OutputLocked(JobFileError):
    """Another run holds OUTPUT's lock: one line for the user."""


class OutputLock:
    def __init__(self, output: str):
        self.path = output + SUFFIX
        self._fd: int | None = None

    def acquire(self) -> "OutputLock":
        """Raises OutputLocked (another run has it) or OSError (the folder is not writable)."""
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f" (pid {holder})" if holder else ""
                raise OutputLocked(f"another llamabatch run{who} is writing {self.path[:-len(SUFFIX)]} "
                                   f"(lock {self.path}); wait for it to end, or write elsewhere") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # removed by the run that just released it: lock the new file instead
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return self
        raise OutputLocked(f"cannot lock {self.path}: it keeps being replaced")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.remove(self.path)  # while still locked: nobody can have locked this inode meanwhile
        except OSError:
            pass
        os.close(self._fd)  # closing releases the flock
        self._fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None
