"""`run --error-file PATH`: failed lines' records go there instead of OUTPUT.

Same record shape as inline (an OpenAI Batch line's error record is OpenAI's error-file
line), so OUTPUT holds only successes (finish_reason stop or length) and the error file
what OpenAI's `error_file_id` would. Without the flag every record stays in OUTPUT.

`Routes` is the writer's choice of file per record: a retried line (--retry-failed) goes
to the retry journal (retry_journal.py merges it), a failure to the error file, the rest to OUTPUT.
"""
from __future__ import annotations

import os
from typing import Any

from ...results import Result
from ...errors import JobFileError
from .output_sink import Sink, open_output, stream_kind
from ...openai_format import LineError, LineRequest, failed
from ..resume.id_sets import IdSet


def open_error_file(path: str, output: str | None, input_path: str) -> Sink:
    """The --error-file sink, checked like OUTPUT before the model loads. Raises JobFileError."""
    if path == "-" or output in (None, "-"):
        raise JobFileError("--error-file needs OUTPUT to be a file (-o FILE) and is a file itself, not -")
    if stream_kind(path) is not None:
        raise JobFileError(f"--error-file {path} is {stream_kind(path)}, not a regular file")
    if os.path.exists(path) and os.path.exists(output):
        try:
            if os.path.samefile(path, output):
                raise JobFileError(f"--error-file {path} is OUTPUT; give the error file a name of its own")
        except OSError:
            pass
    elif os.path.abspath(path) == os.path.abspath(output):
        raise JobFileError(f"--error-file {path} is OUTPUT; give the error file a name of its own")
    sink = open_output(path, input_path)
    return sink


class Routes:
    def __init__(self, output: Sink, errors: Sink | None = None, journal: Sink | None = None,
                 retry: IdSet | None = None):
        self.output = output
        self.errors = errors
        self.journal = journal
        self.retry = retry

    def __call__(self, item: LineRequest | LineError, result: Result) -> Sink:
        # a duplicate of a retried id is a line of its own, never the retried line's answer
        if self.journal is not None and result.error_code != "duplicate_id" and item.id in self.retry:
            return self.journal
        if self.errors is not None and failed(result):
            return self.errors
        return self.output

    def sinks(self) -> list[Any]:
        return [s for s in (self.errors, self.journal) if s is not None]
