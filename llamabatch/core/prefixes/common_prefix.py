"""How many leading items two sequences share, for token lists, byte strings and text alike.

Prefix sharing between slots (core/prefixes/prefix.py), the disk prefix store's index (over byte keys)
and `run`'s start order (over prompt text) all ask it, often of thousands of items, so the
items are compared a slice at a time (one C comparison each), never one by one in Python.
"""
from __future__ import annotations

from typing import Sequence

_CHUNK = 1024  # items per slice while walking towards the first difference


def common_prefix(a: Sequence, b: Sequence) -> int:
    """The number of leading items `a` and `b` have in common (both of one type: two lists,
    two byte strings or two strings; a list never equals a tuple)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the common case, a whole match: one comparison
        return n
    low = 0  # a[:low] == b[:low]; a[:n] != b[:n]
    while n - low > _CHUNK:  # walk to the slice that differs
        mid = low + _CHUNK
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            n = mid
    while n - low > 1:  # then bisect inside it
        mid = (low + n) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            n = mid
    return low
