"""OpenRequests: the handles of the requests an engine has accepted and not yet ended, and the
one way each of them ends (its telemetry recorded, then its handle given its Result).

Every lane (work_lane.py) ends its requests here, so a request of any kind gets exactly one
terminal Result and the same outcome record.
"""
from __future__ import annotations

from ...errors import LlamaBatchError
from ...results import Delta, EmbeddingResult, Result
from ..engine_base import error_result, record_outcome
from ..handle import RequestHandle
from ..telemetry import Telemetry


class OpenRequests:
    """Request id -> handle, from submit until the request's Result; added to under the engine's
    lock, read and ended on the engine thread."""

    def __init__(self, telemetry: Telemetry, deterministic: bool):
        self.telemetry = telemetry
        self.deterministic = deterministic  # stamped on every Result these requests get
        self._handles: dict[int, RequestHandle] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def add(self, handle: RequestHandle) -> None:
        self._handles[handle.request_id] = handle

    def deliver(self, request_id: int, delta: Delta) -> None:
        """Stream part of a request's output to its handle (gone: nobody is left to tell)."""
        handle = self._handles.get(request_id)
        if handle is not None:
            handle._deliver(delta)

    def finish(self, request_id: int, result: Result) -> None:
        """The request's one terminal Result: recorded, then handed to its handle."""
        handle = self._handles.pop(request_id, None)
        record_outcome(self.telemetry, result)
        if handle is not None:
            handle._finish(result)

    def reject(self, handle: RequestHandle, exc: LlamaBatchError) -> None:
        """End a request whose input was refused at submit (it never reached a lane)."""
        result = error_result(handle.request_id, str(exc), exc.code, deterministic=self.deterministic)
        if handle.kind == "embed":
            result = EmbeddingResult.ended(result)
        record_outcome(self.telemetry, result)
        handle._finish(result)
