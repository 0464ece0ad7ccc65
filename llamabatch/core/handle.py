"""RequestHandle: what an engine's `submit` gives back for one request (every engine's).

Iterate it for streamed Deltas; `result()` waits for the one terminal Result. The engine
feeds it (`_deliver`, `_finish`); callers only read and cancel. It knows its engine only
through the cancel callable it is given, so it depends on no engine.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator, Union

from ..results import Delta, Result

log = logging.getLogger("llamabatch.engine")

EventCallback = Callable[["RequestHandle", Union[Delta, Result]], None]
CancelCallable = Callable[["RequestHandle"], None]
_END = object()


class RequestHandle:
    """One submitted request. Iterate it for streamed Deltas; `result()` gives the Result."""

    def __init__(self, cancel: CancelCallable | None, request_id: int, stream: bool, callback: EventCallback | None):
        """`cancel(handle)` asks the engine to stop the request (None: it cannot be cancelled)."""
        self._cancel = cancel
        self.request_id = request_id
        self._stream = stream
        self._callback = callback
        self._deltas: list[Any] = []
        self._cond = threading.Condition()
        self._result: Result | None = None
        self._work: Any = None  # the in-process engine's (lane, request), for cancel (core/lanes/)
        self.kind = "generate"  # or "embed": its Result is an EmbeddingResult

    def __iter__(self) -> Iterator[Delta]:
        i = 0
        while True:
            with self._cond:
                while i >= len(self._deltas):
                    self._cond.wait()
                item = self._deltas[i]
            i += 1
            if item is _END:
                return
            yield item

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the terminal Result (raises TimeoutError if `timeout` seconds pass first)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._result is not None, timeout):
                raise TimeoutError(f"request {self.request_id} still running after {timeout}s")
            return self._result  # type: ignore[return-value]

    @property
    def done(self) -> bool:
        return self._result is not None

    def cancel(self) -> None:
        """Ask the engine to stop this request; its Result gets finish_reason 'cancelled'."""
        if self._cancel is not None and self._result is None:
            self._cancel(self)

    # -- called by the engine thread --------------------------------------------------

    def _deliver(self, delta: Delta) -> None:
        if self._stream:
            with self._cond:
                self._deltas.append(delta)
                self._cond.notify_all()
        if self._callback is not None:
            self._call(delta)

    def _call(self, item: Any) -> None:
        try:
            self._callback(self, item)  # type: ignore[misc]
        except Exception:  # a caller's bug must not stop the engine serving everyone else
            log.exception("callback for request %s failed", self.request_id)

    def _finish(self, result: Result) -> None:
        with self._cond:
            if self._result is not None:
                return  # exactly one terminal outcome
            self._result = result
            self._deltas.append(_END)
            self._cond.notify_all()
        if self._callback is not None:
            self._call(result)
