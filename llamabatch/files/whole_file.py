"""Reading a small file whole (a grammar, a JSON schema, a prompt template, the run manifest,
a bench --json document, a chat transcript): the one place that bounds its size, decodes it
as UTF-8 and parses JSON, so each way it can be wrong is one line naming the file.

Why a bound: a path the user gives may be /dev/zero, a FIFO fed forever, or a 20 GB file
named by mistake; reading "the whole file" then takes all the memory there is (and the
kernel's OOM killer takes other processes with it). At most `limit` + 1 bytes are read.
Devices and pipes are still read (`--grammar-file <(make-grammar)` is a pipe), just never
past the bound. JSON goes through json_line.loads: a 100,000-deep `[[[...` or a
5,000-digit number is an error of the file, not a RecursionError or ValueError traceback.
"""
from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest
from .json_line import BadJSON, loads

# Far above any grammar, schema, template, manifest, bench document or transcript a person
# writes; the same size as the longest line serve-stdin reads.
MAX_WHOLE_FILE_BYTES = 64 << 20

# UnreadableFile.kind: what went wrong, for callers whose own message for it is older
MISSING, UNREADABLE, TOO_LARGE, NOT_UTF8, NOT_JSON = "missing", "unreadable", "too_large", "not_utf8", "not_json"


class UnreadableFile(InvalidRequest):
    """The file could not be read, is larger than its bound, is not UTF-8 text, or not JSON.
    The message is one line: "<what> <path>: <why>"; `kind` says which (the constants above)."""

    def __init__(self, what: str, path: str, kind: str, why: str):
        super().__init__(f"{what} {path}: {why}")
        self.what, self.path, self.kind, self.why = what, path, kind, why


def read_bytes(path: str, what: str, limit: int = MAX_WHOLE_FILE_BYTES) -> bytes:
    """At most `limit` bytes of the file at `path`; larger is UnreadableFile (TOO_LARGE), as is
    every OSError (MISSING for a path that does not exist). `what` names it for the message:
    "--grammar-file", "the manifest"."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError as exc:
        raise UnreadableFile(what, path, MISSING, exc.strerror or str(exc)) from None
    except OSError as exc:
        raise UnreadableFile(what, path, UNREADABLE, exc.strerror or str(exc)) from None
    except (OverflowError, ValueError) as exc:  # a path with a NUL byte, a limit too large
        raise UnreadableFile(what, path, UNREADABLE, str(exc)) from None
    if len(data) > limit:
        raise UnreadableFile(what, path, TOO_LARGE, f"larger than {_size(limit)}, which is as much as is read "
                                                    "of it (is it the file you meant?)")
    return data


def read_text(path: str, what: str, limit: int = MAX_WHOLE_FILE_BYTES) -> str:
    """The file's text (UTF-8; a byte-order mark is kept as text is). UnreadableFile otherwise."""
    return decode(read_bytes(path, what, limit), what, path)


def read_json(path: str, what: str, limit: int = MAX_WHOLE_FILE_BYTES) -> Any:
    """The file's JSON value, any type: the caller checks its shape. UnreadableFile otherwise."""
    return parse_json(read_text(path, what, limit), what, path)


def decode(data: bytes, what: str, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(what, path, NOT_UTF8, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_json(text: str, what: str, path: str) -> Any:
    try:
        return loads(text, whole="the file")
    except BadJSON as exc:
        raise UnreadableFile(what, path, NOT_JSON, f"not valid JSON: {exc.message}") from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"
