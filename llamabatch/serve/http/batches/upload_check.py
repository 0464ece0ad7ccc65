"""The lines of an uploaded batch input file, checked as they arrive (chunk by chunk, never the
whole file in memory) with the line parser `llamabatch run` and `run --dry-run` use.

A file is refused when it is not a batch input file: past OpenAI's limits (200 MB, 50,000
requests), or a line that is no OpenAI Batch request at all (not JSON and no custom_id to be
found, a plain prompt line). A request line whose body is wrong (an unknown field, a bad
temperature, an unknown url) is kept: when the batch runs it becomes that line's record in the
batch's error file, as OpenAI reports a failed request.
"""
from __future__ import annotations

from ....openai_format import OPENAI, LineError, LineParser
from ....params import SamplingParams
from ..api_errors import ApiError, bad_request
from ..limits import MAX_BODY_BYTES, UploadLimits

MAX_LINE_BYTES = MAX_BODY_BYTES  # one request line is at most what one online request body may be


class UploadCheck:
    """Feed it the file's bytes in chunks; `finish()` checks the last line. Raises ApiError."""

    def __init__(self, defaults: SamplingParams, limits: UploadLimits = UploadLimits()):
        self.limits = limits
        self.parser = LineParser(defaults, input_format="jsonl")
        self.bytes = 0
        self.lines = 0  # non-blank lines
        self.urls: set[str] = set()
        self._line_no = 0
        self._partial = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.bytes > self.limits.max_bytes:
            raise too_large(self.limits.max_bytes)
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._grow(chunk[start:])
                return
            self._grow(chunk[start:end])
            self._line(bytes(self._partial))
            self._partial.clear()
            start = end + 1

    def _grow(self, piece: bytes) -> None:
        """Add `piece` to the line being read; refused once the line passes MAX_LINE_BYTES,
        whether or not its newline is in the same chunk."""
        if len(self._partial) + len(piece) > MAX_LINE_BYTES:
            raise bad_request(f"line {self._line_no + 1} is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB",
                              param="file", code="line_too_long")
        self._partial += piece

    def finish(self) -> None:
        if self._partial:
            self._line(bytes(self._partial))
            self._partial.clear()
        if self.lines == 0:
            raise bad_request("the file has no request lines", param="file", code="empty_file")

    def _line(self, raw: bytes) -> None:
        self._line_no += 1
        item = self.parser.parse(raw, self._line_no)
        if item is None:
            return
        self.lines += 1
        if self.lines > self.limits.max_lines:
            raise bad_request(f"the file has more than {self.limits.max_lines:,} requests, the most a batch may hold",
                              param="file", code="too_many_lines")
        if item.shape != OPENAI:
            why = item.message if isinstance(item, LineError) else f"line {self._line_no} is not an OpenAI Batch request"
            raise bad_request(f"{why} (a batch input file holds one request a line: "
                              '{"custom_id", "method": "POST", "url", "body"})', param="file", code="invalid_line")
        if not isinstance(item, LineError) and item.url:
            self.urls.add(item.url)


def too_large(most: int) -> ApiError:
    shown = f"{most / 1_000_000:g} MB" if most >= 1_000_000 else f"{most:,} bytes"
    return ApiError(413, f"the file is larger than {shown}, the most a batch input file may be", param="file",
                    code="file_too_large")
