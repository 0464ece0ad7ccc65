"""What a finished job did: `run_job`'s answer and `Job.wait()`'s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tokens:
    prompt: int = 0
    cached: int = 0  # of prompt, served from the prompt cache
    restored: int = 0  # of cached, from the disk prefix store
    generated: int = 0
    # structured output: lines by grammar backend ("llguidance", "llama") and the tokens the grammar forced
    grammar_backends: dict[str, int] = field(default_factory=dict)
    forced: int = 0
    # speculative decoding: guessed tokens kept in answers and guesses turned down (docs/speculative.md)
    accepted_prediction: int = 0
    rejected_prediction: int = 0
    # priority: lines preempted by higher-priority ones, and the seconds they waited put aside
    preempted: int = 0
    paused_s: float = 0.0


@dataclass(frozen=True)
class VerifyOutcome:
    """`verify=N`: sampled lines re-run one at a time and compared token by token."""

    seen: int  # finished lines the sample was drawn from
    deterministic: bool  # whether the engine promised batch-independent answers
    samples: int  # lines re-run
    differences: tuple[tuple[Any, str], ...]  # (line id, what differed)


@dataclass(frozen=True)
class JobReport:
    ok: int  # records this run wrote with finish_reason stop or length
    failed: int  # records this run wrote with an error
    # INPUT lines (or table rows) read, those already answered included:
    # ok + failed + already_answered + not_written
    lines: int
    output: str | None  # where the records went (None: stdout); a table OUTPUT's path for a table
    manifest: str | None  # OUTPUT's manifest (None: no manifest beside a stream)
    error_file: str | None
    cancelled: bool  # Job.cancel() stopped it before INPUT's end
    interrupted: bool  # Ctrl-C stopped it (run_job)
    elapsed_s: float
    already_answered: int = 0  # resume: lines OUTPUT held already
    # lines that got no record: cancelled, read ahead but never started, or past an OUTPUT
    # that failed; a resume runs them
    not_written: int = 0
    abandoned: int = 0  # of not_written, still running when the drain time ran out
    not_started: int = 0  # of not_written, read ahead but never started (the job stopped first)
    unit: str = "line"  # "row" for a table INPUT
    error: str | None = None  # what ended the job early (OUTPUT unwritable, INPUT cut short, no engine left)
    output_failed: bool = False  # the error: OUTPUT (or the error file) could not be written
    stopped: bool = False  # the job stopped before INPUT's end (cancelled, interrupted, or an error)
    resumable: bool = False  # OUTPUT is a regular file a resume can read back
    records_output: str | None = None  # a table OUTPUT's JSONL records file (what a resume reads)
    table_rows: int | None = None  # rows written to a table OUTPUT
    table_error: str | None = None  # the table OUTPUT could not be written (its records are kept)
    tokens: Tokens = field(default_factory=Tokens)
    restarts: int = 0  # engine processes restarted after a crash
    hangs: int = 0  # of them, killed by the watchdog
    isolated: tuple[Any, ...] = ()  # ids of lines whose request crashed the engine process
    read_note: str | None = None  # something about INPUT that cost no line (replaced while read)
    cluster_summary: tuple[str, ...] = ()  # run on Ray: what each worker did
    verify: VerifyOutcome | None = None

    @property
    def written(self) -> int:
        return self.ok + self.failed

    @property
    def complete(self) -> bool:
        """Every INPUT line has its record (in OUTPUT or the error file)."""
        return not (self.stopped or self.error or self.not_written)
