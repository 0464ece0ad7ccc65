"""The run manifest: `OUTPUT.manifest.json`, what produced OUTPUT (docs/long-jobs.md).

Written when a run starts (status "running") and again when it ends, always whole: the
new text goes to a temporary file in the same folder, is fsynced, and is renamed over the
old one, so a reader (or a kill -9) only ever sees the previous manifest or the new one.
This module reads and writes the file; what goes into it is manifest_fields.py's job.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from ...errors import JobFileError
from ...files.replaced_file import replacing, sync_folder
from ...files.whole_file import MISSING, NOT_JSON, NOT_UTF8, UnreadableFile, read_json

FORMAT = "llamabatch-run-manifest"
VERSION = 1  # bumped when a field changes meaning; a newer file is refused on --resume
SUFFIX = ".manifest.json"


class ManifestProblem(JobFileError):
    """The manifest beside OUTPUT can't be used to check a resume (missing, torn, newer)."""


def manifest_path(output: str) -> str:
    return output + SUFFIX


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def write_atomic(path: str, text: str) -> None:
    """Replace `path` by `text` all at once (write, fsync, rename, fsync the folder). Raises OSError."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    sync_folder(os.path.dirname(os.path.abspath(path)))  # the rename itself survives a power cut


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n")


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest at `path`. Raises ManifestProblem with one line saying what is wrong:
    missing, unreadable, larger than a manifest can be, not JSON (torn), not a manifest,
    newer, or damaged (a field of the wrong type: see _damage)."""
    try:
        data = read_json(path, "the manifest")
    except UnreadableFile as exc:
        if exc.kind == MISSING:
            raise ManifestProblem(f"no manifest {path}") from None
        if exc.kind in (NOT_UTF8, NOT_JSON):
            raise ManifestProblem(f"the manifest {path} is not valid JSON (truncated?): {exc.why}") from None
        raise ManifestProblem(f"cannot read the manifest {path}: {exc.why}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestProblem(f"{path} is not a llamabatch run manifest")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestProblem(f"the manifest {path} has no version")
    if version > VERSION:
        raise ManifestProblem(f"the manifest {path} is version {version}, newer than this llamabatch reads "
                              f"({VERSION})")
    damage = _damage(data)
    if damage is not None:
        raise ManifestProblem(f"the manifest {path} is damaged: {damage}")
    return data


# The fields `run --resume` and `report` use as objects: each is an object or null. A file
# edited by hand or by another program may hold anything there; it is refused as a whole
# (like a torn one) rather than failing halfway through a resume.
OBJECT_FIELDS = ("model", "engine", "sampling", "setting_sources", "chat_template", "input", "output",
                 "fingerprint", "counts", "tokens")
# A history entry's numbers are summed and divided on every run's end: each is null or a
# number a float holds exactly (a 400-digit integer would overflow the sum).
HISTORY_NUMBERS = ("wall_s", "records_written", "generated_tokens", "generated_tok_s")
LARGEST_NUMBER = 2 ** 53


def _damage(data: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a manifest's fields (the first thing found), or None."""
    for key in OBJECT_FIELDS:
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f'"{key}" is {_kind(data[key])}, not an object'
    if "history" not in data:
        return None  # a new history starts with this run (manifest_fields.start_event)
    history = data["history"]
    if not isinstance(history, list):
        return f'"history" is {_kind(history)}, not a list'
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            return f'"history"[{i}] is {_kind(entry)}, not an object'
        for key in HISTORY_NUMBERS:
            value = entry.get(key)
            if value is not None and not _is_number(value):
                return f'"history"[{i}].{key} is not a number (of at most {LARGEST_NUMBER})'
        changed = entry.get("changed_settings")
        if changed is not None and not (isinstance(changed, list) and all(isinstance(c, str) for c in changed)):
            return f'"history"[{i}].changed_settings is not a list of text'
    return None


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LARGEST_NUMBER  # false for inf and nan too


def _kind(value: Any) -> str:
    return {str: "text", list: "a list", dict: "an object", bool: "true or false", int: "a number",
            float: "a number"}.get(type(value), "null")
