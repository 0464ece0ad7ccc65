"""The store's background writer: one daemon thread running queued writes, never blocking the
caller that queues them.

The queued and running writes hold at most `max_pending_bytes` of payload in memory (an entry
is up to tens of MB); a write offered beyond that is refused on the spot, except when nothing
is pending (one entry always fits: its snapshot is in memory already). A bound in bytes, not
in writes: a chat saves one small entry per turn, and a script typing turns faster than a slow
disk writes them must not lose a turn's entry to two others still queued. The thread is a
daemon and close() waits only as long as it is told, so a write hung on a dead disk can delay
neither the caller nor the end of the process.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

log = logging.getLogger("llamabatch.prefix_store")


class BackgroundWriter:
    def __init__(self, max_pending_bytes: int, name: str = "llamabatch-prefix-store-writer") -> None:
        self._max_bytes = max_pending_bytes
        self._name = name
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[[], None], int]] = deque()
        self._pending = 0  # queued + running
        self._pending_bytes = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        with self._cond:
            return self._pending

    def has_room(self, nbytes: int) -> bool:
        with self._cond:
            return self._room(nbytes)

    def _room(self, nbytes: int) -> bool:
        return not self._closed and (self._pending == 0 or self._pending_bytes + nbytes <= self._max_bytes)

    def submit(self, job: Callable[[], None], nbytes: int) -> bool:
        """Queue `job`, which holds `nbytes` of payload until it has run; False (and nothing
        queued) when closed or the pending writes already hold too much."""
        with self._cond:
            if not self._room(nbytes):
                return False
            self._pending += 1
            self._pending_bytes += nbytes
            self._jobs.append((job, nbytes))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write has finished; False if `timeout` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float) -> int:
        """Let queued writes finish for at most `timeout` seconds, then stop taking any; returns
        how many queued writes were dropped. A write still running is left to its daemon thread."""
        deadline = time.monotonic() + max(timeout, 0.0)
        self.flush(max(timeout, 0.0))
        with self._cond:
            self._closed = True
            dropped = len(self._jobs)
            self._pending -= dropped
            self._pending_bytes -= sum(nbytes for _, nbytes in self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(deadline - time.monotonic(), 0.0))
        return dropped

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return  # closed and nothing left
                job, nbytes = self._jobs.popleft()
            try:
                job()
            except Exception:  # a job handles its own OSErrors; anything else is a bug, not a crash
                log.debug("prefix store: write failed", exc_info=True)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._pending_bytes -= nbytes
                    self._cond.notify_all()
