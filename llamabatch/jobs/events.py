"""What a running job tells its caller, in order (`Job.events()`, `run_job(on_event=...)`).

Events are data: the CLI turns them into progress bars and lines on stderr, the HTTP
server into a batch's status. Text in a Notice is a sentence for people, without any
program-name prefix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from .progress import Snapshot

if TYPE_CHECKING:
    from .job_report import JobReport


@dataclass(frozen=True)
class Started:
    """The engine is open and the first line is about to start."""

    model: str  # what records call the model
    why_model: str  # how the model was chosen ("" when not known: a shared engine)
    n_parallel: int
    slot_ctx: int
    slots_reason: str  # why this many slots ("" when set explicitly)
    kernels: str  # which llama.cpp kernels run ("" when not known)
    cluster: str | None  # run on Ray: the workers, described; None locally
    input: str
    output: str | None  # None: the job's stdout
    layout_reason: str = ""  # the KV layout the job chose from its file, and why ("" when not chosen)


@dataclass(frozen=True)
class Progress:
    snapshot: Snapshot


@dataclass(frozen=True)
class LineFinished:
    """One INPUT line (or table row) got its record."""

    line_no: int
    id: Any
    ok: bool  # finish_reason stop or length
    code: str | None  # failed: the error code (or the finish reason)
    message: str | None  # failed: why
    unit: str  # "line", or "row" for a table INPUT


@dataclass(frozen=True)
class Stopping:
    """The job stopped reading INPUT (cancel): the lines in flight finish, or with
    `in_flight_cancelled` are cancelled (they get no record; a resume runs them)."""

    in_flight: int
    in_flight_cancelled: bool
    drain_timeout_s: float | None  # how long in-flight lines may still take (None: no bound)


@dataclass(frozen=True)
class Abandoned:
    """The drain time ran out: `lines` still in flight get no record and the engine is stopped."""

    lines: int


@dataclass(frozen=True)
class Notice:
    """A sentence for people. `always`: worth showing even when progress is hidden (a
    merge finished, a resume read back); otherwise part of the progress story."""

    text: str
    always: bool = False


@dataclass(frozen=True)
class Done:
    report: "JobReport"


JobEvent = Union[Started, Progress, LineFinished, Stopping, Abandoned, Notice, Done]
