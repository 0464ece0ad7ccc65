"""The batch loop of a job (`run_job`, `llamabatch run`).

Four threads, one job each:
  - the reader (here) parses INPUT line by line and numbers the lines it admits: at most
    `window` admitted lines not yet written, so memory stays constant however long INPUT
    is; a bad line's error record goes to the writer at once, a good line waits in the
    start order (start_order.py, at most `reorder_window` lines);
  - the starter (here) starts waiting lines, at most `max_inflight` in the engine, the next
    one chosen so that lines sharing a prompt prefix start together;
  - the engine thread runs requests and calls back with each Result;
  - the writer (record_writer.py) writes records.
The job's thread watches it (batch_watch.py): progress, and stopping when asked: the first
request stops admitting and lets in-flight lines finish, the second cancels them (their
lines get no record, so a resume runs them again); the drain is bounded, then the lines
still in flight are abandoned (no record) and the engine is stopped.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Iterator

from ..api import EngineAPI
from ..core.handle import RequestHandle
from ..errors import LlamaBatchError
from ..core.poison import MAX_CRASHES
from .resume.crash_journal import CrashJournal
from ..openai_format import LineError, LineParser, LineRequest, duplicate_id_error, error_result
from ..results import EmbeddingResult, Result
from ..supervised import ENGINE_CRASHED, ENGINE_UNAVAILABLE
from .progress import RunClock, Snapshot
from .resume.id_sets import Answered, IdSet
from .reading.input_source import BackgroundCount, Source
from .reading.start_order import StartOrder
from .writing.record_writer import RecordWriter

log = logging.getLogger("llamabatch.jobs")

# A line read from a stream (a pipe, a terminal) starts at most this long after it arrives, even
# when the start order is not full: the next lines may be minutes away.
STREAM_LINGER_S = 0.05


class BatchLoop:
    def __init__(self, engine: EngineAPI, parser: LineParser, source: Source, writer: RecordWriter,
                 window: threading.Semaphore, *, max_inflight: int, answered: Answered | None = None,
                 on_result: Callable[[LineRequest, Result], None] | None = None, reorder_window: int = 1,
                 start_last: Callable[[Any], bool] | None = None,
                 slots: int = 1, crashes: CrashJournal | None = None):
        self.engine = engine
        self.parser = parser
        self.source = source
        self.writer = writer
        self.answered = answered
        self.on_result = on_result  # sees every engine Result with its line (run --verify samples them)
        self.crashes = crashes  # lines in flight when an earlier process died (crash_journal.py)
        self.admitted = 0  # lines numbered for the writer (seq numbers 0..admitted-1), in read order
        self.skipped = 0  # lines already answered in OUTPUT (--resume)
        self.cancelled = False  # the second Ctrl-C came
        self.read_error: str | None = None
        self.isolated: list = []  # ids of lines whose request crashed the engine process (engine_crashed)
        self.read_note: str | None = None  # something to tell about INPUT that cost no line
        self.abandoned = 0  # lines still in flight when the drain bound ran out (no record)
        self._abandoned: set[int] = set()  # their seqs: an answer arriving later is dropped
        self._stopping = False
        self._window = window
        self._inflight = threading.Semaphore(max_inflight)
        self._order = StartOrder(reorder_window, recent=slots, last=start_last)  # the slots hold the last `slots` started
        self._room = threading.Semaphore(self._order.window)  # free places in the start order
        self._seen = IdSet()
        self._handles: dict[int, RequestHandle] = {}
        self._items: dict[int, LineRequest] = {}  # the lines of _handles
        self._suspect_running = False  # a line an earlier crash implicated is in the engine, alone
        self._lock = threading.RLock()  # admission vs stop/cancel; re-entered when submit fails early
        self._changed = threading.Condition(self._lock)  # the start order or the reader's state changed
        # When the starter may stop waiting for the start order to fill: the reader waits on a
        # slow INPUT (a pipe) or on the writer's window; None while it reads on.
        self._stalled_at: float | None = None
        self._reader_done = threading.Event()
        self._starter_done = threading.Event()
        self.clock = RunClock()
        self._reader = threading.Thread(target=self._read, name="llamabatch-reader", daemon=True)
        self._starter = threading.Thread(target=self._start_lines, name="llamabatch-starter", daemon=True)

    def start(self) -> None:
        self.clock.start()
        self._reader.start()
        self._starter.start()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def seen_ids(self) -> IdSet:
        """The ids of every INPUT line read (after a full read: INPUT's ids)."""
        return self._seen

    @property
    def finished(self) -> bool:
        # Once stopping, `admitted` can't grow (checked under the lock) and the lines waiting
        # to start were skipped, so this is final even while the reader still blocks on a slow stdin.
        return (self._starter_done.is_set() or self._stopping) and self.writer.handled >= self.admitted

    def _stop(self) -> None:
        """Admit and start nothing more (call with the lock held). The lines read but not yet
        started get no record, like cancelled ones: --resume runs them."""
        self._stopping = True
        for seq, _item in self._order.drain():
            self.writer.skip(seq, started=False)
            self._room.release()
        self._changed.notify_all()

    def stop_admitting(self) -> int:
        """Read and start no further; return how many lines are still in the engine."""
        with self._lock:
            self._stop()
            return len(self._handles)

    def cancel_inflight(self) -> int:
        with self._lock:
            self._stop()
            self.cancelled = True
            handles = list(self._handles.values())
        for handle in handles:
            handle.cancel()
        return len(handles)

    def abandon_inflight(self) -> int:
        """The drain bound ran out: every line still in the engine gets no record (--resume runs
        it), then the engine is stopped (a supervised one kills its process). Returns how many."""
        with self._lock:
            self._stop()
            self.cancelled = True
            seqs = sorted(self._handles)
            self._abandoned.update(seqs)
            self._handles.clear()
            self.abandoned += len(seqs)
        for seq in seqs:
            self._journal_end(self._items.pop(seq), answered=False)
            self.writer.skip(seq)
            self._inflight.release()
        self.engine.kill()
        return len(seqs)

    @property
    def restarts(self) -> int:
        """Engine processes started after a crash (a supervised engine; 0 in-process)."""
        return self.engine.restarts

    def snapshot(self, counter: BackgroundCount | None) -> Snapshot:
        stats = self.engine.stats()
        elapsed = max(self.clock.elapsed(), 1e-6)
        tok_s = self.clock.rate(stats.generated_tokens)
        written = self.writer.stats.written
        done = written + self.skipped
        total = counter.total if counter is not None else None
        eta = None
        if total is not None and written:
            eta = max(0, total - done) / (written / elapsed)
        return Snapshot(done=done, total=total, failed=self.writer.stats.failed,
                        tok_s=tok_s,
                        active=stats.slots_prefilling + stats.slots_generating,
                        n_parallel=stats.n_parallel, eta_s=eta, unit=f"{self.unit}s")

    @property
    def unit(self) -> str:
        """What one INPUT entry is called in messages: "line", or "row" for a table (table_input.py)."""
        return getattr(self.source, "unit", "line")

    # -- the reader thread -------------------------------------------------------------------

    def _read(self) -> None:
        try:
            for line_no, raw in self._lines():
                if self._stopping:
                    break
                item = self.parser.parse(raw, line_no)
                if item is None:
                    continue
                first_use = self._seen.add(item.id)
                if self.answered is not None and self.answered.covers(item.id, first_use):
                    self.skipped += 1
                    continue
                if not first_use:
                    item = duplicate_id_error(item)
                elif self.crashes is not None and self.crashes.is_poisoned(item.id):
                    item = self._poisoned(item)
                if not self._admit(item):
                    break
            else:
                self.read_error, self.read_note = self.source.changed()
        except OSError as exc:
            self.read_error = f"cannot read INPUT {self.source.name}: {exc.strerror or exc}"
        except Exception as exc:  # never leave the main thread waiting on a dead reader
            log.exception("reader failed")
            self.read_error = f"reading INPUT failed: {exc}"
        finally:
            with self._lock:
                self._reader_done.set()
                self._changed.notify_all()

    def _poisoned(self, item: LineRequest | LineError) -> LineError:
        """A line that took the process down, alone, in earlier runs: its record, never a third run."""
        self.isolated.append(item.id)
        return LineError(item.line_no, item.id, ENGINE_CRASHED,
                         f"{self.unit} {item.line_no}: its request took the engine's process down in "
                         f"{MAX_CRASHES} earlier runs, the last time alone in it; it is not run again",
                         item.shape, item.url, item.echo, item.row)

    def _lines(self) -> Iterator[tuple[int, Any]]:
        """INPUT's lines; while the next one is awaited from a stream (a pipe, a terminal), the
        starter may start what is read after STREAM_LINGER_S instead of waiting for more."""
        lines = iter(self.source.lines())
        # (a regular file or a table never makes the reader wait for a producer)
        linger = STREAM_LINGER_S if isinstance(self.source, Source) and not self.source.is_file else None
        while True:
            if linger is not None:
                self._stalled_at = time.monotonic() + linger
            try:
                entry = next(lines)
            except StopIteration:
                return
            finally:
                self._stalled_at = None
            yield entry

    def _acquire(self, sem: threading.Semaphore) -> bool:
        while not sem.acquire(timeout=0.1):
            if self._stopping:
                return False
        return True

    def _admit(self, item: LineRequest | LineError) -> bool:
        """Number the line; an error goes to the writer, a request waits to be started."""
        to_engine = isinstance(item, LineRequest)
        if to_engine and not self._acquire(self._room):
            return False
        if not self._window.acquire(blocking=False):
            # The writer's window is full: no line comes until one is written, so waiting for
            # the start order to fill would wait forever (the oldest line may be in it).
            with self._lock:
                self._stalled_at = time.monotonic()
                self._changed.notify_all()
            got = self._acquire(self._window)
            self._stalled_at = None
            if not got:
                if to_engine:
                    self._room.release()
                return False
        with self._lock:
            if self._stopping:
                self._window.release()
                if to_engine:
                    self._room.release()
                return False
            seq = self.admitted
            self.admitted += 1
            if not to_engine:
                self.writer.put(seq, item, item.result())
                return True
            self._order.add(seq, item)
            self._changed.notify_all()
        return True

    # -- the starter thread ------------------------------------------------------------------

    def _start_lines(self) -> None:
        try:
            while self._acquire(self._inflight):
                with self._lock:
                    entry = self._next_line()
                    if entry is None:
                        self._inflight.release()
                        break
                    self._room.release()
                    self._wait_for_quarantine(entry[1])
                    self._submit(*entry)
        except Exception as exc:  # never leave the main thread waiting on a dead starter
            log.exception("starter failed")
            with self._lock:
                self.read_error = f"starting lines failed: {exc}"
                self._stop()
        finally:
            self._starter_done.set()

    def _next_line(self) -> tuple[int, LineRequest] | None:
        """The next line to start (lock held), once the start order is full or nothing more
        comes soon; None when the run is stopping or every line has started."""
        while not self._stopping:
            if len(self._order):
                stalled = self._stalled_at is not None and time.monotonic() >= self._stalled_at
                if (self._order.full or self._reader_done.is_set() or stalled) and not self._others_first():
                    return self._order.take()
            elif self._reader_done.is_set():
                return None
            self._changed.wait(STREAM_LINGER_S / 2)
        return None

    def _others_first(self) -> bool:
        """(lock held) Only lines that start last wait, and other lines are still in flight:
        those end first (start_order.py says why)."""
        if not self._order.only_last_wait():
            return False
        last = self._order.last
        return any(not last(item) for item in self._items.values())  # type: ignore[misc]

    def _wait_for_quarantine(self, item: LineRequest) -> None:
        """(lock held) A line an earlier process died with runs alone: it waits for the engine
        to empty, and nothing starts while it runs. Returns at once when stopping (_submit skips)."""
        if self.crashes is None:
            return
        suspect = self.crashes.is_suspect(item.id)
        while not self._stopping and (self._suspect_running or (suspect and self._handles)):
            self._changed.wait(0.05)

    def _submit(self, seq: int, item: LineRequest) -> None:
        """Hand one line to the engine (lock held, one inflight place taken)."""
        if self._stopping:  # cannot happen under the lock after _next_line, but never lose a line
            self._inflight.release()
            self.writer.skip(seq, started=False)
            return
        suspect = self.crashes is not None and self.crashes.is_suspect(item.id)
        if self.crashes is not None:
            self.crashes.started(item.id)  # before the engine has it: a crash from here on names it
        try:
            callback = functools.partial(self._on_event, seq, item)
            if item.embed is not None:
                handle = self.engine.submit_embedding(item.embed.inputs, dimensions=item.embed.dimensions,
                                                      callback=callback)
            else:
                handle = self.engine.submit(item.prompt, item.params, stream=False, callback=callback)
        except LlamaBatchError as exc:  # the engine refuses (closed): this line still gets its record
            self._inflight.release()
            if self.engine.fatal_error is not None:  # no engine left: --resume runs it
                self._stop()
                self._journal_end(item, answered=False)
                self.writer.skip(seq)
                return
            self._journal_end(item, answered=True)
            self.writer.put(seq, item, error_result(exc.code, str(exc)))
            return
        except Exception as exc:  # a bug: seq is counted, so it must get a record or the run waits forever
            log.exception("submitting line %d failed", item.line_no)
            self._inflight.release()
            self._journal_end(item, answered=True)
            self.writer.put(seq, item, error_result("internal_error", f"{type(exc).__name__}: {exc}"))
            return
        if not handle.done:  # a request that failed at submit has already called back
            self._handles[seq] = handle
            self._items[seq] = item
            self._suspect_running = self._suspect_running or suspect

    def _journal_end(self, item: LineRequest, answered: bool) -> None:
        if self.crashes is not None:
            self.crashes.ended(item.id, answered)

    # -- the engine thread -------------------------------------------------------------------

    def _on_event(self, seq: int, item: LineRequest, handle: RequestHandle, event: Any) -> None:
        if not isinstance(event, (Result, EmbeddingResult)):
            return  # a Delta: only whole results are written
        answered = event.error_code != ENGINE_UNAVAILABLE and event.finish_reason != "cancelled"
        with self._lock:
            if seq in self._abandoned:  # already skipped when the drain bound ran out: one outcome per line
                return
            self._handles.pop(seq, None)
            self._items.pop(seq, None)
            self._changed.notify_all()  # a line that starts last may be waiting for the others to end
            if event.error_code == ENGINE_UNAVAILABLE:  # the engine process could not be restarted
                self._stop()
            if self.crashes is not None:
                self.crashes.ended(item.id, answered)
                self._suspect_running = any(self.crashes.is_suspect(i.id) for i in self._items.values())
                self._changed.notify_all()
        self._inflight.release()
        if event.error_code == ENGINE_UNAVAILABLE:
            self.writer.skip(seq)  # never ran to the end: --resume runs it again
        elif event.finish_reason == "cancelled":
            self.writer.skip(seq)  # no answer: --resume runs this line again
        else:
            if event.error_code == ENGINE_CRASHED:
                self.isolated.append(item.id)
            if self.on_result is not None and isinstance(event, Result):  # --verify reruns generation only
                self.on_result(item, event)
            self.writer.put(seq, item, event)
