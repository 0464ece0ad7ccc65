"""Progress of a job on stderr: a rich bar on a terminal, plain periodic lines when
stderr is a file or pipe (CI logs, `2> log`), nothing with --quiet.

Reporters only format what they are given (a Snapshot from the job's Progress events).
All calls come from the main thread.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from ...jobs.progress import RATE_WINDOW_S, Snapshot


def clock_duration(seconds: float | None) -> str:
    """A clock reading, h:mm:ss or m:ss ("?" when unknown); chat's stats use Go's 1.2s style."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _details(snap: Snapshot) -> str:
    return (f"{snap.tok_s:.1f} tok/s (last {RATE_WINDOW_S:g} s), {snap.active}/{snap.n_parallel} slots busy, {snap.failed} failed, "
            f"ETA {clock_duration(snap.eta_s)}" + (f" | {snap.extra}" if snap.extra else ""))


class Reporter:
    """Quiet: progress, failure notes and the summary are dropped; `say` lines always show."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr

    def update(self, snap: Snapshot) -> None:
        pass

    def note(self, message: str) -> None:
        """A line for people that --quiet hides (a failed line, the summary)."""

    def say(self, message: str) -> None:
        """A line that always shows (interrupts, how to resume, fatal errors)."""
        print(message, file=self.stream, flush=True)

    def close(self) -> None:
        pass


class PlainReporter(Reporter):
    """One line every `every` seconds: readable in a log file, no control characters."""

    def __init__(self, stream: TextIO | None = None, every: float = 10.0):
        super().__init__(stream)
        self.every = every
        self._last = time.monotonic()

    def update(self, snap: Snapshot) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        total = "?" if snap.total is None else str(snap.total)
        self.say(f"llamabatch run: {snap.done}/{total} {snap.unit}, {_details(snap)}")

    def note(self, message: str) -> None:
        self.say(message)


class RichReporter(Reporter):
    """A live bar: lines done / total, recent tok/s, busy slots, failed count, ETA."""

    def __init__(self, stream: TextIO | None = None):
        super().__init__(stream)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

        self.console = Console(file=self.stream, highlight=False)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.fields[unit]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[details]}"), console=self.console,
                                 refresh_per_second=4)
        self.task = self.progress.add_task("lines", total=None, details="", unit="lines")
        self.progress.start()

    def update(self, snap: Snapshot) -> None:
        self.progress.update(self.task, completed=snap.done, total=snap.total, details=_details(snap), unit=snap.unit)

    def note(self, message: str) -> None:
        self.say(message)

    def say(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.progress.stop()


def make_reporter(quiet: bool, every: float, stream: TextIO | None = None, *, live_ok: bool = True,
                  stream_isatty: bool | None = None) -> Reporter:
    """`live_ok=False` when records go to the same terminal: a live bar would be torn by them.
    `stream_isatty` (default: ask the stream) says whether `stream` is a terminal."""
    stream = stream if stream is not None else sys.stderr
    if quiet:
        return Reporter(stream)
    if (stream.isatty() if stream_isatty is None else stream_isatty) and live_ok:
        return RichReporter(stream)
    return PlainReporter(stream, every)
