"""OUTPUT of a job: opened and checked before the model loads, written one whole record at a
time, and read back on resume. OUTPUT is opened for appending: nothing in it is destroyed
before the model has loaded.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import BinaryIO, TextIO

from ...errors import InvalidRequest, JobFileError
from ...openai_format import is_unnamed_error, record_error_code, record_id
from ..resume.id_sets import Answered


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class Sink:
    """OUTPUT: a file opened for appending, or stdout. One write + flush per record."""

    def __init__(self, name: str, stream: BinaryIO, created: bool, *, owned: bool = True):
        self.name = name  # the path, or "-" for stdout
        self.stream = stream
        self.owned = owned  # close the stream at the end (not a stream the caller handed in)
        self.created = created  # this run made the file (removed again if the model fails to load)
        self.restore_fd: int | None = None  # stdout: the real fd 1, put back at close

    @property
    def is_stdout(self) -> bool:
        return self.name == "-"

    @property
    def label(self) -> str:
        return "stdout" if self.is_stdout else f"OUTPUT {self.name}"

    @property
    def is_regular_file(self) -> bool:
        try:
            return not self.is_stdout and stat.S_ISREG(os.fstat(self.stream.fileno()).st_mode)
        except (OSError, ValueError):
            return False

    @property
    def is_terminal(self) -> bool:
        try:
            return os.isatty(self.stream.fileno())
        except (OSError, ValueError):
            return False

    def write_line(self, data: bytes) -> None:
        self.stream.write(data)
        self.stream.flush()  # on disk (page cache) at once: a kill -9 loses at most this line

    def sync(self) -> None:
        try:
            os.fsync(self.stream.fileno())
        except (OSError, ValueError):
            pass  # a pipe or terminal: nothing to sync

    def start_fresh(self) -> None:
        """Empty the file (a run without --resume replaces OUTPUT). Raises JobFileError."""
        if self.is_stdout:
            return
        try:
            if stat.S_ISREG(os.fstat(self.stream.fileno()).st_mode):  # /dev/full, a FIFO: nothing to empty
                self.stream.truncate(0)
        except OSError as exc:
            raise JobFileError(f"cannot write {self.label}: {_why(exc)}") from None

    def close(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self.sync()
        if self.restore_fd is not None:  # stdout: give fd 1 back
            sys.stdout.flush()
            os.dup2(self.restore_fd, 1)
            os.close(self.restore_fd)
            self.restore_fd = None
        if self.owned and (not self.is_stdout or self.stream is not sys.stdout.buffer):
            try:
                self.stream.close()
            except OSError:
                pass  # a broken pipe: what could be written was

    def discard(self) -> None:
        """Undo opening: the run never started (e.g. the model failed to load)."""
        if self.is_stdout:
            self.close()
            return
        self.stream.close()
        if self.created:
            try:
                os.remove(self.name)
            except OSError:
                pass


def open_output(path: str | None, input_path: str, stdout: TextIO | None = None) -> Sink:
    """OUTPUT: `path`, or for None / "-" the command's stdout (default: the process's)."""
    if path is None or path == "-":
        stdout = stdout if stdout is not None else sys.stdout
        if stdout is sys.__stdout__ or stdout is sys.stdout:
            return _stdout_sink()
        return Sink("-", stdout.buffer, False, owned=False)  # an embedding caller's stream: not ours to close
    if os.path.isdir(path):
        raise JobFileError(f"cannot write OUTPUT {path}: is a directory")
    if input_path != "-" and os.path.exists(path):
        try:
            same = os.path.samefile(path, input_path)
        except OSError:
            same = False
        if same:
            raise JobFileError(f"OUTPUT {path} is the INPUT file; write the results somewhere else")
    kind = stream_kind(path)
    if kind is not None:
        # A pipe, a FIFO, /dev/stdout or a terminal: there is nothing to append to or read back
        # (append mode would seek, which a pipe refuses), so open it write-only. A FIFO's open
        # waits for its reader, as a shell's `>` does.
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as exc:
            raise JobFileError(f"cannot write OUTPUT {path}: {_why(exc)} ({kind})") from None
        return Sink(path, os.fdopen(fd, "wb"), False)
    created = not os.path.exists(path)
    try:
        stream = open(path, "a+b")  # checks we may write, destroys nothing
    except OSError as exc:
        raise JobFileError(f"cannot write OUTPUT {path}: {_why(exc)}") from None
    return Sink(path, stream, created)


def stream_kind(path: str) -> str | None:
    """What OUTPUT is when it exists and is not a regular file ("a FIFO (named pipe)", ...),
    else None. stat follows links: /dev/stdout is what fd 1 is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    from ...models.gguf_header import file_kind

    return "a pipe" if stat.S_ISFIFO(mode) and path.startswith(("/dev/", "/proc/")) else file_kind(mode)


def refuse_resume_to_stream(path: str) -> None:
    """--resume reads OUTPUT back and appends to it: refuse a stream before opening it (a
    FIFO's open would wait for a reader first). Raises InvalidRequest."""
    kind = stream_kind(path)
    if kind is not None:
        raise InvalidRequest(f"cannot resume: OUTPUT {path} is {kind}, not a regular file; --resume reads OUTPUT "
                           "back, so give it the file the earlier run wrote")


def _stdout_sink() -> Sink:
    """Records go to a private copy of fd 1, and fd 1 itself points at stderr while the run
    lasts, so a stray print (or a C library's printf) can't corrupt the data stream."""
    if sys.stdout is not None:
        sys.stdout.flush()
    try:
        private = os.dup(1)
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no real fd 1 (an embedding host): write where sys.stdout writes
        if sys.stdout is None:  # `llamabatch run ... >&-`
            raise JobFileError("cannot write stdout: it is closed") from None
        return Sink("-", sys.stdout.buffer, False, owned=False)
    sink = Sink("-", os.fdopen(private, "wb"), False)
    sink.restore_fd = saved
    return sink


def read_back(sink: Sink, answered: Answered | None = None) -> tuple[Answered, int]:
    """Read OUTPUT for --resume: the ids it answers, and how many bytes of a torn last line
    (a write cut short by a kill) were cut off so the next record starts on a fresh line.
    `answered`: add to these (OUTPUT's, when reading the --error-file back)."""
    answered = answered if answered is not None else Answered()
    f = sink.stream
    try:
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (OSError, ValueError):
        regular = False
    if not regular:  # /dev/full reads as endless NUL bytes, a FIFO as whatever comes: nothing to resume
        raise JobFileError(f"cannot resume: OUTPUT {sink.name} is not a regular file")
    f.seek(0)
    good_end = 0
    line_no = 0
    for raw in f:
        line_no += 1
        if not raw.endswith(b"\n"):
            break  # the torn last line: every record is written whole with its "\n"
        if raw.strip():
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise JobFileError(f"cannot resume: OUTPUT {sink.name} line {line_no} is not valid JSON "
                                   "(only its last line may be torn); fix or remove that line") from None
            line_id = record_id(record)
            if line_id is None and not is_unnamed_error(record):
                raise JobFileError(f"cannot resume: OUTPUT {sink.name} line {line_no} has no id or custom_id "
                                   "(is it a llamabatch run output?)")
            answered.add(line_id, record_error_code(record))
        good_end += len(raw)
    f.seek(0, os.SEEK_END)
    torn = f.tell() - good_end
    if torn:
        f.truncate(good_end)
        f.flush()
        sink.sync()
    return answered, torn
