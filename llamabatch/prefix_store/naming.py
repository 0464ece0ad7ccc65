"""Names in a prefix store: the fingerprint folder, entry keys, entry and tmp file names.

root/<fingerprint folder>/<key>.kv            a complete entry (only ever made by os.replace)
root/<fingerprint folder>/.<key>.<pid>.tmp    an entry being written by process <pid>
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Mapping

ENTRY_SUFFIX = ".kv"
_TMP_NAME = re.compile(r"^\.([0-9a-f]{64})\.([0-9]+)\.tmp$")
_ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.kv$")
_FOLDER_NAME = re.compile(r"^[0-9a-f]{16}$")


def canonical_fingerprint(fingerprint: Mapping[str, str]) -> str:
    """One spelling per fingerprint (sorted keys, no spaces), so equal settings hash equally."""
    return json.dumps(dict(fingerprint), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint_folder(fingerprint: Mapping[str, str]) -> str:
    return hashlib.sha256(canonical_fingerprint(fingerprint).encode("ascii")).hexdigest()[:16]


def entry_key(folder: str, tokens_le: bytes) -> str:
    """Content address of an entry: its fingerprint folder and its tokens (uint32 little endian)."""
    digest = hashlib.sha256(folder.encode("ascii"))
    digest.update(tokens_le)
    return digest.hexdigest()


def entry_file(key: str) -> str:
    return key + ENTRY_SUFFIX


def is_entry_file(name: str) -> bool:
    return _ENTRY_NAME.match(name) is not None


def is_fingerprint_folder(name: str) -> bool:
    # Housekeeping only ever deletes inside folders named like this, so a store root pointed
    # at a folder that holds other things (someone's own *.kv files) cannot cost them a file.
    return _FOLDER_NAME.match(name) is not None


def tmp_file(key: str, pid: int) -> str:
    # Starts with a dot and does not end in .kv: never indexed, loaded or counted by the LRU.
    return f".{key}.{pid}.tmp"


def tmp_file_pid(name: str) -> int | None:
    """The writer's pid if `name` is one of our tmp files, else None."""
    match = _TMP_NAME.match(name)
    return int(match.group(2)) if match else None
