"""A job: every line of INPUT through an engine, one record per line in OUTPUT, resumable.

`start_job` does in the caller's thread everything that can fail for the whole job (bad
settings, files that cannot be used, a resume whose settings differ, the model), so those
raise at once, typed (llamabatch.errors). The lines then run on the job's own thread; the
caller follows them through `Job.events()`, stops them with `Job.cancel()`, and gets the
JobReport from `Job.wait()`. `run_job` is the three together, with Ctrl-C handled as the
CLI handles it: the first stops reading INPUT, the second cancels the lines in flight; the
files are whole either way and a resume runs what got no record.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

from ..engines import open_engine
from ..errors import InvalidRequest
from .batch_watch import StopRequests
from .estimates.estimate import estimate_lines
from .events import Done, JobEvent, Progress
from .job_opening import OpenedJob, checked_tables, line_parser, open_job
from .job_report import JobReport
from .job_running import run_opened
from .job_spec import JobHost, job_settings, log
from .writing.written_files import refuse_own_file

EVENT_WAIT_S = 0.1  # how often run_job looks at its `cancel` event while no event comes
_PROGRESS = object()  # the queue's place for the latest Progress event


class Job:
    """One started job. Thread-safe: `cancel` may be called from any thread, a signal
    handler included."""

    def __init__(self, opened: OpenedJob):
        self._opened = opened
        self._events: queue.Queue = queue.Queue()
        self._stops = StopRequests()
        self._report: JobReport | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._ended = False  # events() has handed out Done
        self.interrupted = False  # set by run_job on Ctrl-C: the report says so
        for event in opened.early_events:
            self._events.put(event)
        self._progress: Progress | None = None  # the latest snapshot, while its place in the queue waits
        self._progress_lock = threading.Lock()
        opened.publish = self._publish
        self._thread = threading.Thread(target=self._run, name="llamabatch-job", daemon=True)
        self._thread.start()

    @property
    def output(self) -> str | None:
        return self._opened.spec.output

    @property
    def writes_to_terminal(self) -> bool:
        """Records go to a terminal (a live progress bar there would be torn by them)."""
        return self._opened.sink.is_terminal

    @property
    def ended(self) -> bool:
        """events() has handed out Done (or the job's thread failed: wait() raises why)."""
        return self._ended

    def _run(self) -> None:
        try:
            self._report = run_opened(self._opened, self._stops, lambda: self.interrupted)
        except BaseException as exc:  # handed to wait()'s caller, whose job it was
            self._error = exc
        finally:
            self._finished.set()
            self._events.put(Done(self._report) if self._report is not None else None)

    def cancel(self, *, in_flight: bool = False) -> None:
        """Stop starting lines; the lines in flight finish (or with `in_flight`, are cancelled:
        they get no record). OUTPUT, the manifest and the error file stay whole and valid; a
        resume runs every line without a record."""
        self._stops.ask(in_flight)

    def _publish(self, event: JobEvent) -> None:
        # One place in the queue for progress, taken by the latest snapshot: a caller that takes
        # events late (or never: wait() alone) keeps one event per line, not one per quarter second.
        if isinstance(event, Progress):
            with self._progress_lock:
                waiting, self._progress = self._progress is not None, event
            if waiting:
                return
            event = _PROGRESS
        self._events.put(event)

    def next_event(self, timeout: float | None = None) -> JobEvent | None:
        """The next event, waiting at most `timeout` seconds (None when none came, or after Done)."""
        if self._ended:
            return None
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        if event is _PROGRESS:
            with self._progress_lock:
                event, self._progress = self._progress, None
        if event is None or isinstance(event, Done):
            self._ended = True
            if event is None:  # the job's thread failed: wait() raises what it raised
                return None
        return event

    def events(self) -> Iterator[JobEvent]:
        """Every event in order, ending with Done (progress snapshots a few times a second).
        Events are kept until taken: one per line (LineFinished) plus the latest snapshot."""
        while not self._ended:
            event = self.next_event(EVENT_WAIT_S)
            if event is not None:
                yield event

    def wait(self, timeout: float | None = None) -> JobReport:
        """The report, once the job has ended (its files closed). Raises TimeoutError when
        `timeout` passes first."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the job on {self._opened.spec.input} is still running")
        self._thread.join()
        if self._report is None:
            raise self._error if self._error is not None else RuntimeError("the job ended without a report")
        return self._report


def start_job(input: str, output: str | None = None, *, engine: Any = None, host: JobHost | None = None,
              **settings: Any) -> Job:
    """Check everything, open OUTPUT (and the engine, unless `engine` shares one) and start
    the lines. Settings are `llamabatch run`'s option names (docs/library.md). Raises
    InvalidRequest (bad settings), JobFileError (a file that cannot be used), ModelLoadError."""
    host = host or JobHost()
    if not isinstance(input, str) or not input:
        raise InvalidRequest(f"input must be a path (or - for stdin), got {input!r}")
    spec, resolved = job_settings(input, output, settings, host, engine)
    return Job(open_job(spec, resolved, host, engine))


def run_job(input: str, output: str | None = None, *, engine: Any = None,
            on_event: Callable[[JobEvent], None] | None = None, cancel: threading.Event | None = None,
            host: JobHost | None = None, **settings: Any) -> JobReport:
    """Run the job to its end and return its report. `on_event` sees every event (from this
    thread); setting `cancel` stops the job as Job.cancel() does. Ctrl-C stops reading INPUT
    (a second one cancels the lines in flight): the report then says interrupted, and the
    same call with resume=True runs the rest."""
    job = start_job(input, output, engine=engine, host=host, **settings)
    presses = 0
    while True:
        try:
            event = job.next_event(EVENT_WAIT_S)
            if cancel is not None and cancel.is_set():
                job.cancel()
            if event is not None and on_event is not None:
                on_event(event)
            if event is None and job.ended:
                return job.wait()
        except KeyboardInterrupt:
            presses += 1
            job.interrupted = True
            job.cancel(in_flight=presses > 1)
            if presses > 2:  # a third: the caller insists; the files stay whole up to here
                raise


def estimate_job(input: str, output: str | None = None, *, host: JobHost | None = None,
                 **settings: Any) -> dict[str, Any]:
    """What the job would cost, as data (`llamabatch run --dry-run --json` prints it): lines,
    invalid ones by code, prompt tokens, prefix reuse, output tokens at most, slots and an ETA
    from the `auto` calibration; with resume=True what is left. Every line is parsed and
    tokenized (the model loads, with one small slot); nothing is generated or written."""
    host = host or JobHost()
    spec, resolved = job_settings(input, output, settings, host)
    tables = checked_tables(spec, resolved)
    try:
        parser = line_parser(spec, resolved, tables)
        if spec.error_file is not None:
            refuse_own_file(spec.error_file, tables.output, tables.records_output, spec.input)
        return estimate_lines(resolved, parser, spec.input, tables.records_output, resume=spec.resume,
                              retry_failed=spec.retry_failed, error_file=spec.error_file, stdin=host.stdin,
                              open_tokenizer=lambda r: open_engine(r, factory=host.engine_factory,
                                                                   on_notice=host.tell or log.warning),
                              table_source=tables.source,
                              table_rows=tables.rows_up_to(1 << 62) if tables.reads_table else None,
                              sizes_context=spec.ray is None)
    finally:
        tables.close()
