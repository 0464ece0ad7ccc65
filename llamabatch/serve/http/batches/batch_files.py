"""A batch's files: where its job writes, how many records each holds, and registering them as
File objects when the batch ends (purpose "batch_output", as OpenAI's output and error files).

Registering is safe to repeat: the batch row names the file ids first, then the file rows are
added if missing, so a kill -9 while finalizing is finished by the next start.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..catalogue import Catalogue
from ..data_dir import DataDir
from ..object_ids import FILE, new_id
from .records import BatchRecord, FileRecord

OUTPUT, ERRORS = "output.jsonl", "errors.jsonl"
_CHUNK = 1 << 20


@dataclass
class BatchPaths:
    input: str
    output: str
    errors: str
    output_rel: str
    errors_rel: str


def batch_paths(data: DataDir, batch: BatchRecord, input_rel: str) -> BatchPaths:
    folder = data.batch_folder(batch.id)
    out_rel, err_rel = os.path.join(folder, OUTPUT), os.path.join(folder, ERRORS)
    return BatchPaths(data.absolute(input_rel), data.absolute(out_rel), data.absolute(err_rel), out_rel, err_rel)


def whole_lines(path: str) -> int:
    """Records in a JSONL file the job wrote: its newline-ended lines (a torn last line is no record)."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(_CHUNK), b""))
    except FileNotFoundError:
        return 0


def cut_torn_tail(path: str) -> None:
    """Drop a last line without its newline (a record torn by a kill -9), so that what is left
    is whole records; the job's resume does the same when it reopens a file."""
    try:
        f = open(path, "r+b")
    except FileNotFoundError:
        return
    with f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - _CHUNK)
            f.seek(start)
            found = f.read(pos - start).rfind(b"\n")
            if found >= 0:
                pos = start + found + 1
                break
            pos = start
        if pos < end:
            f.truncate(pos)
            os.fsync(f.fileno())


def register_outputs(catalogue: Catalogue, batch: BatchRecord, paths: BatchPaths) -> tuple[int, int]:
    """Name the batch's output and error files (those with records) in its row and add their File
    rows; return (records in output, records in the error file)."""
    ok, failed = whole_lines(paths.output), whole_lines(paths.errors)
    output_id = batch.output_file_id or (new_id(FILE) if ok else None)
    error_id = batch.error_file_id or (new_id(FILE) if failed else None)
    catalogue.update_batch(batch.id, output_file_id=output_id, error_file_id=error_id, completed=ok, failed=failed)
    now = int(time.time())
    for file_id, path, rel, kind in ((output_id, paths.output, paths.output_rel, "output"),
                                     (error_id, paths.errors, paths.errors_rel, "error")):
        if file_id is not None and catalogue.file(file_id) is None:
            catalogue.add_file(FileRecord(file_id, f"{batch.id}_{kind}.jsonl", "batch_output",
                                          os.path.getsize(path), now, rel))
    return ok, failed
