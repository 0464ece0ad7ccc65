"""Entries saved with another KV cache type: found, never loaded, and said why.

A store keeps each fingerprint's entries in a folder of their own, and the fingerprint names
the KV cache types and V's layout (llama/kv_state.py): an engine with q8_0 keys never even
looks into the f16 folder. So the user who switched types is not left wondering why nothing is
restored any more, this file finds the folders whose entries differ from this engine's only in
those settings (same model, llama.cpp and kernels) and words it in one line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from .file_format import BadEntry, _FIXED, _parse_head
from .naming import is_entry_file, is_fingerprint_folder

KV_KEYS = ("cache_types", "v_layout")  # the fingerprint's keys the KV settings decide


def entry_fingerprint(path: str | os.PathLike) -> dict | None:
    """The fingerprint in an entry file's header (not checked against anything), or None."""
    try:
        with open(path, "rb") as f:
            return _parse_head(f.read(_FIXED.size), f.read).fingerprint
    except (OSError, BadEntry):
        return None


def kv_difference(theirs: Mapping[str, str], ours: Mapping[str, str]) -> str | None:
    """Their KV settings ("KV q8_0/q8_0, V by rows (flash attention)") when the two
    fingerprints differ in those alone; None when they agree there or differ elsewhere too."""
    if dict(theirs) == dict(ours):
        return None
    rest = {k: v for k, v in theirs.items() if k not in KV_KEYS}
    if rest != {k: v for k, v in ours.items() if k not in KV_KEYS}:
        return None
    return describe(theirs)


def describe(fingerprint: Mapping[str, str]) -> str:
    # no "v_layout": V by rows (kv_state.fingerprint names only the transposed layout)
    layout = fingerprint.get("v_layout", "by rows (flash attention)")
    return f"KV {fingerprint.get('cache_types', 'f16/f16')}, V {layout}"


def why_not_loaded(name: str, root: str | os.PathLike, ours: Mapping[str, str]) -> str | None:
    """One line when entry `name` ("<folder>/<key>.kv") exists but was saved with other KV
    settings than `ours`; None otherwise (gone, another model: nothing worth saying)."""
    folder, _, file_name = name.partition("/")
    if not is_fingerprint_folder(folder) or not is_entry_file(file_name):
        return None
    theirs = entry_fingerprint(Path(root) / folder / file_name)
    other = kv_difference(theirs, ours) if theirs is not None else None
    if other is None:
        return None
    return f"the saved KV was written with {other}; this engine runs {describe(ours)}: not loaded, evaluated instead"


def other_kv_entries(root: str | os.PathLike, ours: Mapping[str, str], own_folder: str) -> str | None:
    """One line when the store holds entries of this model saved with other KV settings
    (one header read per folder); None when it holds none."""
    counts: dict[str, int] = {}
    try:
        folders = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                   and is_fingerprint_folder(e.name) and e.name != own_folder]
    except OSError:
        return None
    for folder in folders:
        try:
            entries = [e.path for e in os.scandir(folder.path) if is_entry_file(e.name)]
        except OSError:
            continue
        theirs = entry_fingerprint(entries[0]) if entries else None
        other = kv_difference(theirs, ours) if theirs is not None else None
        if other is not None:
            counts[other] = counts.get(other, 0) + len(entries)
    if not counts:
        return None
    found = "; ".join(f"{n} with {other}" for other, n in sorted(counts.items()))
    return (f"prefix store {root}: entries of this model saved with other KV settings ({found}) are not "
            f"loaded by this engine ({describe(ours)}); the same --cache-type-k/--cache-type-v/--flash-attn "
            f"would use them")
