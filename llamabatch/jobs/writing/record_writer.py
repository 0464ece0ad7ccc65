"""The output side of a job: one thread that turns finished lines into records and
writes them, in input order (a bounded reorder buffer) or as they finish.

It has its own thread so the engine thread's callbacks never wait on the disk. Every
record is written whole with its newline and flushed at once; fsync runs at most every
`sync_every` seconds while records arrive, when the queue goes idle, and at close.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ...openai_format import LineError, LineRequest, build_record, failed
from ...results import Result
from .output_sink import Sink

log = logging.getLogger("llamabatch.jobs")

ORDERS = ("input", "completion")
_SKIP = object()  # a line that gets no record in this run (cancelled: --resume runs it again)
_UNSTARTED = object()  # likewise, a line read ahead that the run stopped before starting
_CLOSE = object()


@dataclass
class WriterStats:
    written: int = 0
    ok: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    restored_tokens: int = 0  # of cached_tokens, from the disk prefix store
    # structured output: lines by grammar backend ("llguidance", "llama") and their forced tokens
    grammar_backends: dict[str, int] = field(default_factory=dict)
    forced_tokens: int = 0
    # speculative decoding: guesses kept in answers and guesses turned down (docs/speculative.md)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # priority: lines put aside for higher-priority ones (their KV kept), and their pause in all
    preempted: int = 0
    paused_ms: float = 0.0


class RecordWriter:
    """Receives (seq, line, result) from any thread; `seq` numbers admitted lines 0, 1, 2, ...

    `window` is released once per handled line: the reader acquires it before admitting
    one, so in input order at most that many finished lines wait behind a slow one.
    """

    def __init__(self, sink: Sink, model: str, order: str, window: threading.Semaphore, sync_every: float = 2.0,
                 deterministic: bool = False,
                 route: Callable[[LineRequest | LineError, Result], Sink] | None = None,
                 on_record: Callable[[LineRequest | LineError, Result, bool], None] | None = None):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.sink = sink
        # where each record goes when not all go to `sink` (--error-file, --retry-failed: records.py)
        self.route = route
        self._sinks = {sink}  # every sink written to, for fsync
        self.model = model
        self.deterministic = deterministic  # every record says so, bad lines included
        self.in_order = order == "input"
        self.stats = WriterStats()
        self.handled = 0  # lines written or skipped
        self.skipped = 0  # lines that got no record (cancelled)
        self.unstarted = 0  # lines read ahead that the run stopped before starting (no record)
        self.unwritten = 0  # lines whose record OUTPUT failed to take (the run stops)
        self.error: str | None = None  # set when OUTPUT can't be written: the run must stop
        self.on_record = on_record  # told (line, result, failed) of each record written, on this thread
        self._window = window
        self._sync_every = sync_every
        self._queue: queue.Queue = queue.Queue()
        self._pending: dict[int, Any] = {}  # the reorder buffer: seq -> (line, result) or _SKIP
        self._next = 0
        self._dirty = False
        self._last_sync = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="llamabatch-writer", daemon=True)
        self._thread.start()

    @property
    def not_written(self) -> int:
        """Handled lines without a record: with the records written, every handled line."""
        return self.skipped + self.unstarted + self.unwritten

    def put(self, seq: int, item: LineRequest | LineError, result: Result) -> None:
        self._queue.put((seq, (item, result)))

    def skip(self, seq: int, started: bool = True) -> None:
        """`seq` gets no record in this run (--resume runs it): cancelled, or, with
        `started` False, read ahead but never started (not counted as cancelled)."""
        self._queue.put((seq, _SKIP if started else _UNSTARTED))

    def close(self) -> None:
        """Write what is queued, fsync, stop the thread."""
        self._queue.put(_CLOSE)
        self._thread.join()

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                entry = self._queue.get(timeout=self._sync_every)
            except queue.Empty:
                self._sync()
                continue
            if entry is _CLOSE:
                break
            seq, payload = entry
            if self.in_order:
                self._pending[seq] = payload
                while self._next in self._pending:
                    self._handle(self._pending.pop(self._next))
                    self._next += 1
            else:
                self._handle(payload)
            if self._dirty and time.monotonic() - self._last_sync >= self._sync_every:
                self._sync()
        self._sync()

    def _handle(self, payload: Any) -> None:
        try:
            if payload is _SKIP:
                self.skipped += 1
            elif payload is _UNSTARTED:
                self.unstarted += 1
            else:
                self._write(*payload)
        except Exception as exc:  # a bug must stop the run with a message, not leave it waiting
            log.exception("writing a record failed")
            self.error = f"writing a record failed: {exc}"
        finally:
            self.handled += 1
            self._window.release()

    def _record(self, item: LineRequest | LineError, result: Result) -> dict:
        record = build_record(item, result, self.model)
        if self.deterministic:
            record["deterministic"] = True
        return record

    def _write(self, item: LineRequest | LineError, result: Result) -> None:
        if self.error is not None:
            self.unwritten += 1
            return  # OUTPUT is gone: the run is stopping; nothing more can be saved
        try:
            data = _encode(self._record(item, result))
        except Exception as exc:  # a record that can't be built is still this line's answer, not the run's end
            log.exception("building the record of line %d failed", item.line_no)
            message = f"the record could not be built: {type(exc).__name__}: {exc}"
            item = LineError(item.line_no, item.id, "internal_error", message, item.shape, item.url,
                             row=item.row)  # no echo: it may be what could not be encoded
            result = item.result()
            data = _encode(self._record(item, result))
        sink = self.route(item, result) if self.route is not None else self.sink
        self._sinks.add(sink)
        try:
            sink.write_line(data + b"\n")
        except OSError as exc:
            self.error = f"cannot write {sink.label}: {exc.strerror or exc}"
            self.unwritten += 1
            return
        except ValueError as exc:  # closed stream
            self.error = f"cannot write {sink.label}: {exc}"
            self.unwritten += 1
            return
        self._dirty = True
        s = self.stats
        s.written += 1
        s.prompt_tokens += result.usage.prompt_tokens
        s.cached_tokens += result.usage.cached_tokens
        s.restored_tokens += result.usage.restored_tokens
        s.completion_tokens += result.usage.completion_tokens
        s.accepted_prediction_tokens += result.usage.accepted_prediction_tokens
        s.rejected_prediction_tokens += result.usage.rejected_prediction_tokens
        timings = getattr(result, "timings", None)
        if getattr(timings, "preemptions", 0):
            s.preempted += 1
            s.paused_ms += timings.paused_ms
        backend = getattr(result, "grammar_backend", None)
        if backend:
            s.grammar_backends[backend] = s.grammar_backends.get(backend, 0) + 1
            s.forced_tokens += getattr(result, "forced_tokens", 0)
        bad = failed(result)
        if bad:
            s.failed += 1
        else:
            s.ok += 1
        if self.on_record is not None:
            self.on_record(item, result, bad)

    def _sync(self) -> None:
        if self._dirty:
            for sink in self._sinks:
                sink.sync()
            self._dirty = False
        self._last_sync = time.monotonic()


def _encode(record: dict[str, Any]) -> bytes:
    try:
        return json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in the text: escape it rather than lose the line
        return json.dumps(record).encode("ascii")
