"""The engine as a batch's job sees it: the job submits as many lines as it likes, and the lane
hands them to the engine so that batch lines hold only the slots online work leaves.

Why a lane and not the job's own `max_inflight`: the lane keeps the waiting lines itself and
sends the next one from the engine's own callback, as the previous one ends, so the slot is
refilled in the same tick, and the engine never holds more batch lines than the service
allows (service.batch_inflight: every slot and one queued behind each, or with --online-slots N
the slots less N). Those places are shared by every running batch's lane (batch_share.py):
a lane sends a line when the share hands it a place. Online requests have a higher priority
than batch lines (online.py): the engine admits them before queued batch lines and, when every
slot is busy, puts one aside.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Iterator

from ....core.engine_base import EngineBase
from ....errors import LlamaBatchError
from ....results import EmbeddingResult, Result
from ....openai_format import error_result
from .batch_share import BatchShare


class LaneHandle:
    """What the job holds for one line: the engine's handle once the line is sent."""

    def __init__(self, lane: "BatchLane", callback: Any, kind: str):
        self._lane = lane
        self._callback = callback
        self.kind = kind
        self.inner: Any = None
        self._result: Any = None
        self._ended = threading.Event()
        self.request_id = -1

    @property
    def done(self) -> bool:
        return self._ended.is_set()

    def __iter__(self) -> Iterator[Any]:
        return iter(())  # batch lines are not streamed

    def result(self, timeout: float | None = None) -> Any:
        if not self._ended.wait(timeout):
            raise TimeoutError(f"batch line still running after {timeout}s")
        return self._result

    def cancel(self) -> None:
        if not self._lane._drop(self) and self.inner is not None:
            self.inner.cancel()

    def _event(self, _inner: Any, event: Any) -> None:
        if isinstance(event, (Result, EmbeddingResult)):  # deltas: a batch line writes its whole result
            self._lane._ended_one()  # the next line goes in before this one's record is written
            self._lane.generated_tokens += event.usage.completion_tokens  # /metrics' tokens/s (a GIL-atomic add)
            self._end(event)

    def _end(self, result: Any) -> None:
        self._result = result
        self._ended.set()
        if self._callback is not None:
            self._callback(self, result)


class BatchLane:
    """`share`: the places every running batch's lane takes turns at (batch_share.py), or a
    count of places (a lane alone: a share of its own)."""

    def __init__(self, engine: Any, share: BatchShare | Callable[[], int]):
        self._engine = engine
        self._share = share if isinstance(share, BatchShare) else BatchShare(share)
        self._held: collections.deque = collections.deque()
        self.sent = 0  # this lane's lines in the engine now
        self.taken = 0  # places the share gave it (set by the share: the fewest taken goes next)
        self._stopped = False
        self._lock = self._share.lock  # one lock for all lanes: a place is taken and given under it
        self._share.join(self)
        self.generated_tokens = 0  # by this lane's lines: a batch's tokens/s in /metrics
        self.started = time.monotonic()

    # The rest of the engine API (api.EngineAPI) is the engine's own: what the job reads of the
    # engine (its model, slots, health, totals) is the engine's, whichever lane it goes through.
    config = property(lambda self: self._engine.config)
    default_params = property(lambda self: self._engine.default_params)
    telemetry = property(lambda self: self._engine.telemetry)
    model_name = property(lambda self: self._engine.model_name)
    slot_ctx = property(lambda self: self._engine.slot_ctx)
    kernels = property(lambda self: self._engine.kernels)
    slots_reason = property(lambda self: self._engine.slots_reason)
    fatal_error = property(lambda self: self._engine.fatal_error)
    restarts = property(lambda self: self._engine.restarts)
    hangs = property(lambda self: self._engine.hangs)
    isolated = property(lambda self: self._engine.isolated)
    recovers_crashes = property(lambda self: self._engine.recovers_crashes)
    disk = property(lambda self: self._engine.disk)
    ready = property(lambda self: self._engine.ready)
    # the Ray pool under serve --ray (its workers in the job's header, manifest and progress); None locally
    cluster = property(lambda self: getattr(self._engine, "cluster", None))

    def __enter__(self) -> "BatchLane":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None  # the service owns the engine: a job's `with` never closes it

    def stats(self) -> Any:
        return self._engine.stats()

    def hold(self) -> Any:
        return self._engine.hold()

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        return self._engine.subscribe(callback)

    def tokenize(self, text: str, *, special: bool = False, add_special: bool = True) -> list[int]:
        return self._engine.tokenize(text, special=special, add_special=add_special)

    def token_pieces(self, tokens: Any) -> list[bytes]:
        return self._engine.token_pieces(tokens)

    def save_prefix(self, prompt: Any, *, timeout: float | None = None) -> Any:
        return self._engine.save_prefix(prompt, timeout=timeout)

    # Built on submit and submit_embedding, as every engine's are: through the lane.
    generate = EngineBase.generate
    embed = EngineBase.embed

    def close(self, timeout: float | None = None) -> None:
        """The batch is over: the lane stops and leaves the share; the engine is the service's,
        closed when the service stops."""
        self.stop()
        self._share.leave(self)

    def kill(self) -> None:
        self._engine.kill()

    def submit(self, prompt: Any, params: Any = None, *, stream: bool = True, callback: Any = None) -> LaneHandle:
        handle = LaneHandle(self, callback, "generate")
        return self._hold(handle, lambda: self._engine.submit(prompt, params, stream=False, callback=handle._event))

    def submit_embedding(self, inputs: Any, *, callback: Any = None, **kw: Any) -> LaneHandle:
        handle = LaneHandle(self, callback, "embed")
        return self._hold(handle, lambda: self._engine.submit_embedding(inputs, callback=handle._event, **kw))

    def _hold(self, handle: LaneHandle, send: Callable[[], Any]) -> LaneHandle:
        with self._lock:
            if not self._stopped:
                if not self._held:
                    self._share.waits(self)
                self._held.append((handle, send))
                self._share.feed()
                return handle
        _end_cancelled(handle)
        return handle

    def stop(self) -> None:
        """The batch is cancelled: no held line reaches the engine (each ends cancelled: no record,
        a resume runs it), nor any the job sends after; those in the engine finish."""
        with self._lock:
            self._stopped = True
            held = [handle for handle, _send in self._held]
            self._held.clear()
        for handle in held:
            _end_cancelled(handle)

    def feed(self) -> None:
        """Send what the places now allow (an online request ended, so batch lines may have more)."""
        self._share.feed()

    @property
    def waiting(self) -> bool:
        return bool(self._held)

    def send_next(self) -> bool:
        """The share gave this lane a place (under its lock): the next held line goes to the
        engine; False when the engine refused it (closed), the line ended with that error."""
        handle, send = self._held.popleft()
        self.sent += 1
        try:
            handle.inner = send()
        except LlamaBatchError as exc:  # the engine refuses (closed): this line still ends, once
            self.sent -= 1
            ended = error_result(exc.code, str(exc))
            handle._end(EmbeddingResult.ended(ended) if handle.kind == "embed" else ended)
            return False
        return True

    def _ended_one(self) -> None:
        with self._lock:
            self.sent -= 1
            self._share.ended_one()

    def _drop(self, handle: LaneHandle) -> bool:
        """Cancel a line not yet sent: it ends cancelled without reaching the engine."""
        with self._lock:
            for i, (held, _send) in enumerate(self._held):
                if held is handle:
                    del self._held[i]
                    break
            else:
                return False
        _end_cancelled(handle)
        return True


def _end_cancelled(handle: LaneHandle) -> None:
    ended = error_result("cancelled", "cancelled before it reached the engine")
    ended.finish_reason = "cancelled"
    handle._end(EmbeddingResult.ended(ended) if handle.kind == "embed" else ended)
