"""INPUT of a job: a prompts file or stdin, read as bytes line by line (a million-line file
is never held in memory; each line is decoded on its own so one bad byte spoils one line, not
the job), opened and checked before the model loads, and its lines counted in the background
for the progress total.
"""
from __future__ import annotations

import os
import stat
import sys
import threading
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator, TextIO

from ...errors import JobFileError


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


@dataclass
class Source:
    name: str  # the path, or "-" for stdin
    stream: BinaryIO
    is_file: bool  # a regular file: its lines can be counted ahead
    read_bytes: int = 0  # how far the lines read so far reach

    def __post_init__(self) -> None:
        # What the file was when opened, to notice it being cut short or replaced under the run.
        self._opened: os.stat_result | None = None
        if self.is_file:
            try:
                self._opened = os.fstat(self.stream.fileno())
            except (OSError, ValueError):
                pass

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(1-based line number, raw line) pairs, read lazily."""
        for number, raw in enumerate(self.stream, start=1):
            self.read_bytes += len(raw)
            yield number, raw

    def changed(self) -> tuple[str | None, str | None]:
        """After the last line: (error, note) about INPUT changing while it was read.
        Cut short (truncated, or overwritten with less) is an error: lines were never read.
        Replaced (a new file renamed over it) is a note: this run read the file it opened, whole."""
        if self._opened is None:
            return None, None
        error = note = None
        if self.read_bytes < self._opened.st_size:
            error = (f"INPUT {self.name} was cut short while it was read: it had {self._opened.st_size} bytes "
                     f"when the run started, only {self.read_bytes} could be read; the lines after that did not run")
        try:
            now = os.stat(self.name)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (self._opened.st_dev, self._opened.st_ino):
            note = (f"INPUT {self.name} was {'removed' if now is None else 'replaced'} while it was read; "
                    "this run read the file as it was when the run started")
        return error, note

    def close(self) -> None:
        if self.name != "-":  # stdin's copy stays open: the reader may still block on it
            self.stream.close()


def open_input(path: str, stdin: TextIO | None = None) -> Source:
    """INPUT: `path`, or for "-" the command's stdin (default: the process's)."""
    if path == "-":
        stdin = stdin if stdin is not None else sys.stdin
        # A private reader on a copy of its fd: if Ctrl-C leaves the reader thread blocked in
        # a read, interpreter shutdown must not wait for sys.stdin's lock.
        try:
            return Source("-", os.fdopen(os.dup(stdin.fileno()), "rb"), False)
        except (OSError, ValueError, AttributeError):  # no fd (an in-memory stream), or fd 0 closed
            pass
        if stdin is None or getattr(stdin, "buffer", None) is None:  # `llamabatch run - <&-`
            raise JobFileError("cannot read INPUT -: stdin is closed")
        return Source("-", stdin.buffer, False)
    if os.path.isdir(path):
        raise JobFileError(f"cannot read INPUT {path}: is a directory")
    try:
        stream = open(path, "rb")
    except OSError as exc:
        raise JobFileError(f"cannot read INPUT {path}: {_why(exc)}") from None
    return Source(path, stream, stat.S_ISREG(os.fstat(stream.fileno()).st_mode))


def count_lines(source: Source, cap: int) -> int | None:
    """INPUT's non-blank lines, counting no further than `cap` (enough to bound the slot
    count); None when the file cannot be read again."""
    return count_nonblank(source.name, cap)


def count_nonblank(path: str, cap: int | None = None) -> int | None:
    n = 0
    try:
        with open(path, "rb") as f:
            for raw in f:
                if raw.strip():
                    n += 1
                    if cap is not None and n >= cap:
                        break
    except OSError:
        return None
    return n


class BackgroundCount:
    """A progress total counted on a background thread: None until it is known, and for good
    when counting fails (the run itself reports read errors)."""

    def __init__(self, count: Callable[[], int | None]):
        self.total: int | None = None
        self._thread = threading.Thread(target=self._run, args=(count,), name="llamabatch-count", daemon=True)
        self._thread.start()

    def _run(self, count: Callable[[], int | None]) -> None:
        self.total = count()

    def wait(self, timeout: float) -> int | None:
        """The total, waiting up to `timeout` seconds for it (the run's last progress line)."""
        self._thread.join(timeout)
        return self.total


class LineCounter(BackgroundCount):
    """Counts INPUT's non-blank lines (the progress bar's total)."""

    def __init__(self, path: str):
        super().__init__(lambda: count_nonblank(path))
