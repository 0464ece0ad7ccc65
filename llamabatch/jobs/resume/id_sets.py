"""Which line ids a run has seen (duplicates) and which OUTPUT already answers (--resume).

Both sets grow with the input, the one thing `run` keeps per line. They hold 8-byte
fingerprints in a flat array instead of Python strings, so a million ids cost ~16 MB
rather than ~100 MB. Two different ids sharing a 64-bit fingerprint is the price
(about 3e-8 for a million ids): the second would be reported as a duplicate.

A line whose id could not be read has none (None, openai_format/lines.py's NO_ID): it is never a
duplicate, and OUTPUT's records of such lines are counted, not matched.

A table's default ids are its row numbers, 1, 2, 3, ...: those are kept as one counter
(the run of consecutive integers seen from 1), so a table run's memory does not grow with
its rows (the fingerprints were ~14 MB of a 1M-row run's 137 MB peak, against 2 MB at 100k).
"""
from __future__ import annotations

import hashlib
import json
from array import array
from typing import Any


def id_key(line_id: Any) -> bytes:
    # JSON spelling, so the id 5 and the id "5" stay different
    return json.dumps(line_id, ensure_ascii=False).encode("utf-8")


def _fingerprint(key: bytes) -> int:
    fp = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return fp or 1  # 0 marks an empty slot


class IdSet:
    """A set of ids as 64-bit fingerprints: open addressing, linear probing, load <= 1/2."""

    def __init__(self, capacity: int = 1024):
        size = 1
        while size < 2 * capacity:
            size *= 2
        self._slots = array("Q", bytes(8 * size))
        self._mask = size - 1
        self._count = 0
        self._run = 0  # the integers 1.._run are in the set (not as fingerprints)

    def __len__(self) -> int:
        return self._run + self._count

    def _in_run(self, line_id: Any) -> bool:
        return type(line_id) is int and 1 <= line_id <= self._run  # (not bool: True is not the id 1)

    def __contains__(self, line_id: Any) -> bool:
        if line_id is None:
            return False
        return self._in_run(line_id) or self._has(line_id)

    def _has(self, line_id: Any) -> bool:
        fp = _fingerprint(id_key(line_id))
        i = fp & self._mask
        while True:
            v = self._slots[i]
            if v == 0:
                return False
            if v == fp:
                return True
            i = (i + 1) & self._mask

    def add(self, line_id: Any) -> bool:
        """Add an id; True when it was not there yet (always for None: no id is no duplicate)."""
        if line_id is None:
            return True
        if self._in_run(line_id):
            return False
        if type(line_id) is int and line_id == self._run + 1 and (self._count == 0 or not self._has(line_id)):
            self._run += 1
            return True
        if 2 * (self._count + 1) > len(self._slots):
            self._grow()
        return self._insert(_fingerprint(id_key(line_id)))

    def _insert(self, fp: int) -> bool:
        i = fp & self._mask
        while True:
            v = self._slots[i]
            if v == 0:
                self._slots[i] = fp
                self._count += 1
                return True
            if v == fp:
                return False
            i = (i + 1) & self._mask

    def _grow(self) -> None:
        old = self._slots
        self._slots = array("Q", bytes(16 * len(old)))
        self._mask = len(self._slots) - 1
        self._count = 0
        for fp in old:
            if fp:
                self._insert(fp)


class Answered:
    """What OUTPUT already holds, read by --resume.

    A duplicate_id error record answers a *later* line with that id, not the first one:
    those are counted apart, so a resumed run neither skips the first line's real answer
    nor writes the duplicate's error twice. Records without an id (lines whose id could not
    be read) are counted too: a bad line fails the same way on every run, and such lines'
    records are written in input order, so the first that many of them are answered.
    """

    def __init__(self) -> None:
        self.ids = IdSet()
        self.duplicates: dict[bytes, int] = {}  # id key -> duplicate_id records already written
        self.unnamed = 0  # records without an id not yet matched to an INPUT line
        self.records = 0

    def add(self, line_id: Any, error_code: str | None) -> None:
        self.records += 1
        if line_id is None:
            self.unnamed += 1
        elif error_code == "duplicate_id":
            key = id_key(line_id)
            self.duplicates[key] = self.duplicates.get(key, 0) + 1
        else:
            self.ids.add(line_id)

    def covers(self, line_id: Any, first_use: bool) -> bool:
        """Whether this input line is already answered (consumes a duplicate or unnamed record)."""
        if line_id is None:
            if self.unnamed:
                self.unnamed -= 1
                return True
            return False
        if first_use:
            return line_id in self.ids
        key = id_key(line_id)
        left = self.duplicates.get(key, 0)
        if left:
            self.duplicates[key] = left - 1
            return True
        return False
