"""Opaque random ids for files and batches, and the one check every id from a caller passes
before it is looked up or becomes part of a path.

An id is its prefix and 24 hex digits from `secrets` (96 bits): unguessable, and made only of
characters that are safe in a file name, so a checked id can name a file in the data dir.
Anything else a caller sends ("../x", "file-1/..", a NUL, 10 kB of text) is simply not found.
"""
from __future__ import annotations

import re
import secrets

FILE, BATCH = "file-", "batch_"
_HEX = 24
_SHAPES = {FILE: re.compile(r"file-[0-9a-f]{24}"), BATCH: re.compile(r"batch_[0-9a-f]{24}")}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(_HEX // 2)


def checked(value: object, prefix: str) -> str | None:
    """`value` when it is an id this service could have made with `prefix`, else None."""
    if isinstance(value, str) and _SHAPES[prefix].fullmatch(value):
        return value
    return None


def shown(value: object) -> str:
    """How an id from a caller appears in an error message: as given when short and printable."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > 64 or not text.isprintable():
        return text[:64].encode("unicode_escape").decode("ascii") + ("..." if len(text) > 64 else "")
    return text
