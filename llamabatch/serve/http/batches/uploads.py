"""POST /v1/files: a multipart body streamed into the data dir as it arrives.

The `file` part goes straight into a temporary file beside its final place (and through the
line check, upload_check.py), so an upload costs a 64 kB buffer however large it is; past a
limit it stops at once. `finish` fsyncs it and renames it to files/<id>.jsonl: a file id in the
catalogue always names a whole file. Feed it from a worker thread (writes and line checks block).
"""
from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header

from ....files.replaced_file import sync_folder
from ..api_errors import ApiError, bad_request
from ..limits import MAX_FILENAME
from .upload_check import UploadCheck

MAX_FIELD_BYTES = 1024  # a form field other than the file (purpose)


class MultipartUpload:
    def __init__(self, content_type: str | None, folder: str, check: UploadCheck):
        kind, options = parse_options_header(content_type or "")
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise ApiError(415, "POST /v1/files takes multipart/form-data with the fields purpose and file",
                           code="unsupported_media_type")
        self.check = check
        self.folder = folder
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.temp = os.path.join(folder, f".{secrets.token_hex(8)}.part")
        self._out: Any = None
        self._part: dict[str, Any] = {}
        self._header = [b"", b""]
        self._error: ApiError | None = None
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_part_data": self._data, "on_part_end": self._end,
            "on_header_field": lambda d, s, e: self._header.__setitem__(0, self._header[0] + d[s:e]),
            "on_header_value": lambda d, s, e: self._header.__setitem__(1, self._header[1] + d[s:e]),
            "on_header_end": self._header_end, "on_headers_finished": self._headers_done})

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except ApiError:
            raise
        except Exception as exc:  # python-multipart's own parse errors
            raise bad_request(f"the multipart body cannot be read: {exc}") from None
        if self._error is not None:
            raise self._error

    def finish(self) -> tuple[str, str, UploadCheck]:
        """(purpose, filename, check) once the body ended; the content is at `self.temp`."""
        self._parser.finalize()
        if self._out is None or self.filename is None:
            raise bad_request("the form has no file field", param="file")
        self.check.finish()
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        return self.fields.get("purpose", ""), self.filename, self.check

    def place(self, path: str) -> None:
        """Rename the checked upload to `path` (inside `folder`) and make the rename durable."""
        os.replace(self.temp, path)
        sync_folder(self.folder)

    def discard(self) -> None:
        if self._out is not None and not self._out.closed:
            self._out.close()
        with contextlib.suppress(OSError):
            os.remove(self.temp)

    # -- parser callbacks -----------------------------------------------------------------

    def _begin(self) -> None:
        self._part = {"name": None, "filename": None, "value": bytearray(), "file": False}

    def _header_end(self) -> None:
        field, value = self._header
        self._header = [b"", b""]
        if field.lower() == b"content-disposition":
            _kind, options = parse_options_header(value)
            self._part["name"] = options.get(b"name", b"").decode("utf-8", "replace")
            filename = options.get(b"filename")
            if filename is not None:
                self._part["filename"] = filename.decode("utf-8", "replace")

    def _headers_done(self) -> None:
        if self._part["name"] == "file" and self._part["filename"] is not None:
            if self._out is not None:
                self._error = bad_request("the form has more than one file field", param="file")
                return
            self._part["file"] = True
            self.filename = _clean_name(self._part["filename"])
            self._out = open(self.temp, "wb")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._error is not None:
            return
        piece = data[start:end]
        if self._part.get("file"):
            try:
                self.check.feed(piece)
            except ApiError as exc:
                self._error = exc
                return
            self._out.write(piece)
            return
        self._part["value"] += piece
        if len(self._part["value"]) > MAX_FIELD_BYTES:
            self._error = bad_request(f"form field {self._part['name']!r} is longer than {MAX_FIELD_BYTES} bytes")

    def _end(self) -> None:
        name = self._part.get("name")
        if not self._part.get("file") and name:
            self.fields[name] = bytes(self._part["value"]).decode("utf-8", "replace")


def _clean_name(name: str) -> str:
    """The caller's file name as shown back (never a path: only its last part, printable)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if c.isprintable())[:MAX_FILENAME]
    return base or "upload.jsonl"
