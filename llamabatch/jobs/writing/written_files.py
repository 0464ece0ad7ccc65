"""The files one `llamabatch run` writes for its OUTPUT, so that `--error-file` can't be one of
them: `--error-file OUTPUT.manifest.json` would take error records, then the manifest would be
renamed over them and those lines would have no record anywhere.

Beside a regular OUTPUT a run writes: OUTPUT itself (or, for a table OUTPUT, the table and
its records file), OUTPUT.manifest.json (manifest.py), OUTPUT.lock (output_lock.py),
OUTPUT.retry.jsonl (retry_journal.py), and the temporary files of every write-then-rename
(replaced_file.py: `.NAME.PID.tmp` beside NAME, plus SQLite's -journal/-wal/-shm beside a
table's). Paths are compared resolved (symlinks followed, `./x` and `/abs/x` alike), so no
other spelling of one of them gets through. INPUT is refused too: the run never writes it,
but an error file there would.
"""
from __future__ import annotations

import os
import re

from ...errors import InvalidRequest
from ..resume.manifest import manifest_path
from .output_lock import SUFFIX as LOCK_SUFFIX
from ..resume.retry_journal import journal_path


def own_files(output: str, records_output: str) -> list[tuple[str, str]]:
    """(path, what it is) for each file the run writes for `output` (`records_output`: where
    its JSONL records go, the same path unless OUTPUT is a table)."""
    files = [(output, "OUTPUT")]
    if records_output != output:
        files.append((records_output, "OUTPUT's records file"))
    files += [(manifest_path(records_output), "OUTPUT's manifest"),
              (records_output + LOCK_SUFFIX, "OUTPUT's lock file"),
              (journal_path(records_output), "OUTPUT's --retry-failed journal")]
    return files


def refuse_own_file(error_file: str, output: str | None, records_output: str | None, input_path: str) -> None:
    """Raise InvalidRequest (one line) when --error-file names INPUT or any file the run
    writes, however it is spelled."""
    if output in (None, "-") or records_output is None or error_file == "-":
        return  # open_error_file says what --error-file needs then
    target = os.path.realpath(error_file)
    named = own_files(output, records_output)
    if input_path != "-":
        named.append((input_path, "INPUT"))
    for path, what in named:
        if target == os.path.realpath(path):
            raise InvalidRequest(f"--error-file {error_file} is {what} ({path}); give the error file a name of "
                                 "its own")
        if what != "INPUT" and _temporary_of(target, path):
            raise InvalidRequest(f"--error-file {error_file} is a temporary file's name the run writes beside "
                                 f"{what} ({path}); give the error file a name of its own")


def _temporary_of(target: str, path: str) -> bool:
    """Whether `target` (resolved) is where a write-then-rename of `path` puts its temporary file
    (replaced_file.replacing: `.NAME.PID.tmp` in NAME's folder; SQLite adds -journal, -wal, -shm)."""
    for spelled in {os.path.abspath(path), os.path.realpath(path)}:
        folder, name = os.path.split(spelled)
        if os.path.dirname(target) == os.path.realpath(folder) and re.fullmatch(
                rf"\.{re.escape(name)}\.\d+\.tmp(-journal|-wal|-shm)?", os.path.basename(target)):
            return True
    return False
