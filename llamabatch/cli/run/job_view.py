"""`llamabatch run` on a terminal: a started job's events as progress and lines on stderr,
Ctrl-C and SIGTERM as the job's stop requests, and its report as the last lines and the exit
status (job_summary.py)."""
from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

from ...jobs import Job, JobReport
from ...jobs.events import Abandoned, Done, LineFinished, Notice, Progress, Started, Stopping
from ..env import Environment
from .progress import Reporter, make_reporter

PREFIX = "llamabatch run: "
MAX_FAILURE_NOTES = 10  # failed lines named one by one; then one line says more failed
EVENT_WAIT_S = 0.05  # how often signals are looked at while no event comes


class Interrupts:
    """Counts Ctrl-C presses and SIGTERMs (what service managers and `timeout` send: handled
    the same way); the event loop acts on them (a handler must not touch the display)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None  # the first signal's number: the exit code is 128 + it

    def _handler(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.first is None:
            self.first = signum

    @property
    def word(self) -> str:
        return "terminated" if self.first == signal.SIGTERM else "interrupted"

    @contextlib.contextmanager
    def installed(self) -> Iterator["Interrupts"]:
        previous = {sig: signal.signal(sig, self._handler) for sig in self.SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class JobView:
    """Shows one job's events through a Reporter (bar or plain lines; --quiet hides all but
    what always shows)."""

    def __init__(self, reporter: Reporter, interrupts: Interrupts):
        self.reporter = reporter
        self.interrupts = interrupts
        self.failures = 0

    def show(self, event: Any) -> JobReport | None:
        r = self.reporter
        if isinstance(event, Progress):
            r.update(event.snapshot)
        elif isinstance(event, LineFinished):
            self._failed(event)
        elif isinstance(event, Notice):
            (r.say if event.always else r.note)(PREFIX + event.text)
        elif isinstance(event, Started):
            r.note(PREFIX + header(event))
        elif isinstance(event, Stopping):
            r.say(PREFIX + self._stopping(event))
        elif isinstance(event, Abandoned):
            r.say(f"{PREFIX}{event.lines} line(s) still in flight after the drain time; stopping the engine "
                  "(they get no record; --resume runs them)")
        elif isinstance(event, Done):
            return event.report
        return None

    def _failed(self, event: LineFinished) -> None:
        if event.ok:
            return
        self.failures += 1
        if self.failures <= MAX_FAILURE_NOTES:
            named = f" (id {event.id!r})" if event.id is not None else ""  # None: its id could not be read
            self.reporter.note(f"{PREFIX}{event.unit} {event.line_no}{named} failed: {event.code}: {event.message}")
        elif self.failures == MAX_FAILURE_NOTES + 1:
            self.reporter.note(f"{PREFIX}more {event.unit}s failed; their records in OUTPUT say why")

    def _stopping(self, event: Stopping) -> str:
        if event.in_flight_cancelled:
            return f"cancelling {event.in_flight} in-flight line(s)"
        bound = f" for at most {event.drain_timeout_s:g}s" if event.drain_timeout_s is not None else ""
        return (f"{self.interrupts.word}: reading no further; finishing {event.in_flight} in-flight "
                f"line(s){bound} (Ctrl-C again cancels them)")


def header(event: Started) -> str:
    """The run's first line: the model, its slots and why, INPUT -> OUTPUT."""
    if event.cluster is not None:
        what = event.cluster
    else:
        model = f"{event.model} ({event.why_model})" if event.why_model else event.model
        why = f" ({event.slots_reason})" if event.slots_reason else ""
        kernels = f", {event.kernels}" if event.kernels else ""
        layout = f", {event.layout_reason}" if event.layout_reason else ""
        what = f"{model}, {event.n_parallel} slots x {event.slot_ctx} tokens{why}{kernels}{layout}"
    return f"{what}, {event.input} -> {event.output or 'stdout'}"


def follow(job: Job, *, quiet: bool, progress_every: float, env: Environment) -> tuple[JobReport, Reporter, Interrupts]:
    """Show the job until it ends; Ctrl-C / SIGTERM ask it to stop (a second time: to cancel
    the lines in flight). Returns its report, the reporter (for the last lines) and the signals seen."""
    reporter = make_reporter(quiet, progress_every, env.stderr, live_ok=not job.writes_to_terminal,
                             stream_isatty=env.stderr_isatty)
    interrupts = Interrupts()
    view = JobView(reporter, interrupts)
    report = None
    acted = 0
    try:
        with interrupts.installed():
            while report is None:
                event = job.next_event(EVENT_WAIT_S)
                if interrupts.count > acted:
                    acted = interrupts.count
                    job.cancel(in_flight=acted > 1)
                if event is not None:
                    report = view.show(event)
                elif job.ended:
                    report = job.wait()  # the job's thread failed: raises what it raised
    finally:
        reporter.close()
    return report, reporter, interrupts
