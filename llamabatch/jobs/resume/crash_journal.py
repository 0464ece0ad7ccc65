"""The poison-line rule across processes: a line whose request takes the whole process down
(an engine in this process, `llamabatch serve --no-isolate`, `run --no-isolate`) must not do
it again at every resume.

The supervised engine and the Ray pool apply the rule of core/poison.py in memory: their
worker dies, the job lives on. When the job's own process dies there is no memory left, so
the job keeps a journal beside OUTPUT, `OUTPUT.inflight.jsonl`: a line `{"start": id}` as each
line goes to the engine and `{"end": id, "answered": bool}` as it comes back. A resume that
finds lines started and never ended knows the process died with them in flight, and applies
the same rule, with groups of one:

- every line in flight at the crash gets one more crash on its count (kept in the journal's
  first line, which each open rewrites);
- a line with a crash on its count is a suspect: it runs alone in the engine, and nothing
  starts beside it, so the next crash, if it comes, names it alone;
- a line in flight alone at a crash with `MAX_CRASHES` on its count is poison: it is never
  run again, and gets an `engine_crashed` error record instead.

One poison line among N in flight so costs three process deaths in all, and each innocent
line runs again once, alone. The journal is appended without fsync: it guards against a
process dying, which leaves the page cache whole, not against a power cut. A job that ends
complete removes it.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

from ...core.poison import MAX_CRASHES
from ...files.replaced_file import replacing
from .id_sets import id_key

SUFFIX = ".inflight.jsonl"


def journal_path(output: str) -> str:
    return output + SUFFIX


class CrashJournal:
    """The lines of one job's OUTPUT that were in flight when a process died, and what follows."""

    def __init__(self, path: str, crashes: dict[bytes, tuple[Any, int]], poisoned: dict[bytes, Any]):
        self.path = path
        self._crashes = crashes  # id key -> (id, crashes it was in flight in), for lines with no answer yet
        self._poisoned = poisoned  # id key -> id: never run again
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")

    @classmethod
    def open(cls, path: str, *, resume: bool) -> "CrashJournal":
        """Read what an earlier process left (resume), apply the rule to the lines it died with,
        and start this run's journal. Without resume an old journal means nothing: OUTPUT starts over."""
        crashes: dict[bytes, tuple[Any, int]] = {}
        poisoned: dict[bytes, Any] = {}
        if resume:
            in_flight = _read(path, crashes, poisoned)
            _crashed(in_flight, crashes, poisoned)
        with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"crashes": [[line_id, n] for line_id, n in crashes.values()],
                                "poisoned": list(poisoned.values())}) + "\n")
        return cls(path, crashes, poisoned)

    # -- questions ----------------------------------------------------------------------------

    def is_poisoned(self, line_id: Any) -> bool:
        return id_key(line_id) in self._poisoned

    def is_suspect(self, line_id: Any) -> bool:
        """In flight at a crash and not answered since: it runs alone."""
        with self._lock:
            return id_key(line_id) in self._crashes

    # -- events (any thread) --------------------------------------------------------------------

    def started(self, line_id: Any) -> None:
        self._append({"start": line_id})

    def ended(self, line_id: Any, answered: bool) -> None:
        """The line is back from the engine: `answered` when it got its record (a suspect no
        more), not when it was cancelled or abandoned (a resume runs it again, still a suspect)."""
        if answered:
            with self._lock:
                self._crashes.pop(id_key(line_id), None)
        self._append({"end": line_id, "answered": answered})

    def close(self, *, complete: bool) -> None:
        """Close the file; a complete job's journal is removed (every line has its record)."""
        with self._lock:
            self._file.close()
        if complete:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(entry) + "\n")
                self._file.flush()  # in the page cache: it outlives this process


def _read(path: str, crashes: dict[bytes, tuple[Any, int]], poisoned: dict[bytes, Any]) -> list[Any]:
    """Load an earlier journal into `crashes` and `poisoned`; the ids it started and never ended,
    in the order they started. A torn or foreign line is passed over (the journal is ours)."""
    in_flight: dict[bytes, Any] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for raw in f:
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(entry, dict):
                    continue
                if "crashes" in entry:
                    for pair in entry.get("crashes") or ():
                        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], int):
                            crashes[id_key(pair[0])] = (pair[0], pair[1])
                    for line_id in entry.get("poisoned") or ():
                        poisoned[id_key(line_id)] = line_id
                elif "start" in entry:
                    in_flight[id_key(entry["start"])] = entry["start"]
                elif "end" in entry:
                    key = id_key(entry["end"])
                    in_flight.pop(key, None)
                    if entry.get("answered") is True:
                        crashes.pop(key, None)
    except FileNotFoundError:
        pass
    return list(in_flight.values())


def _crashed(in_flight: list[Any], crashes: dict[bytes, tuple[Any, int]], poisoned: dict[bytes, Any]) -> None:
    """The process died with `in_flight`: one more crash each; alone with MAX_CRASHES, poison."""
    for line_id in in_flight:
        key = id_key(line_id)
        crashes[key] = (line_id, crashes.get(key, (line_id, 0))[1] + 1)
    if len(in_flight) == 1:
        key = id_key(in_flight[0])
        if crashes[key][1] >= MAX_CRASHES:
            poisoned[key] = crashes.pop(key)[0]
