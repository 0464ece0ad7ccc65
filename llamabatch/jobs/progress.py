"""A job's progress as data: what the CLI's progress bar and lines show, and what
`Job.events()` hands a caller in Progress events."""
from __future__ import annotations

from dataclasses import dataclass

# The generated-tokens rate shown is measured over this many seconds (the current speed,
# not the run's average); batch_loop.py keeps its samples for this window.
RATE_WINDOW_S = 5.0


@dataclass
class Snapshot:
    done: int  # lines with a record (this run and, with --resume, earlier ones)
    total: int | None  # non-blank INPUT lines, once counted (None for stdin / not yet)
    failed: int
    tok_s: float  # generated tokens per second over the last RATE_WINDOW_S seconds
    active: int  # slots prefilling or generating
    n_parallel: int
    eta_s: float | None
    extra: str = ""  # run --ray: per-worker lines/s and tok/s
    unit: str = "lines"  # what INPUT is counted in: "rows" for a table
