"""The store's background writer: one daemon thread running queued writes, never blocking the
caller that queues them.

At most `max_pending` writes are queued or running at once (each holds a payload of up to
tens of MB in memory); a write offered beyond that is refused on the spot. The thread is a
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
    def __init__(self, max_pending: int, name: str = "llamabatch-prefix-store-writer") -> None:
        self._max_pending = max_pending
        self._name = name
        self._cond = threading.Condition()
        self._jobs: deque[Callable[[], None]] = deque()
        self._pending = 0  # queued + running
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        with self._cond:
            return self._pending

    def has_room(self) -> bool:
        with self._cond:
            return not self._closed and self._pending < self._max_pending

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue `job`; False (and nothing queued) when closed or max_pending are already pending."""
        with self._cond:
            if self._closed or self._pending >= self._max_pending:
                return False
            self._pending += 1
            self._jobs.append(job)
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
            self._jobs.clear()
            self._pending -= dropped
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
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # a job handles its own OSErrors; anything else is a bug, not a crash
                log.debug("prefix store: write failed", exc_info=True)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
