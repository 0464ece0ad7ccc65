"""The run manifest: `OUTPUT.manifest.json`, what produced OUTPUT (docs/long-jobs.md).

Written when a run starts (status "running") and again when it ends, always whole: the
new text goes to a temporary file in the same folder, is fsynced, and is renamed over the
old one, so a reader (or a kill -9) only ever sees the previous manifest or the new one.
This module reads and writes the file; what goes into it is run_record.py's job.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from ...replaced_file import replacing, sync_folder

FORMAT = "llamabatch-run-manifest"
VERSION = 1  # bumped when a field changes meaning; a newer file is refused on --resume
SUFFIX = ".manifest.json"


class ManifestProblem(Exception):
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
    """The manifest at `path`. Raises ManifestProblem with one line saying what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ManifestProblem(f"no manifest {path}") from None
    except OSError as exc:
        raise ManifestProblem(f"cannot read the manifest {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise ManifestProblem(f"the manifest {path} is not valid JSON (truncated?)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestProblem(f"{path} is not a llamabatch run manifest")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestProblem(f"the manifest {path} has no version")
    if version > VERSION:
        raise ManifestProblem(f"the manifest {path} is version {version}, newer than this llamabatch reads "
                              f"({VERSION})")
    return data
