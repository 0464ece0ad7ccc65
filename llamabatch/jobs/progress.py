"""A job's progress as data: what the CLI's progress bar and lines show, and what
`Job.events()` hands a caller in Progress events."""
from __future__ import annotations

import collections
import time
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


class RunClock:
    """A run's wall clock, and the generated-tokens rate over its last RATE_WINDOW_S seconds."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._ended: float | None = None
        self._samples: collections.deque = collections.deque()  # (time, generated tokens)

    def start(self) -> None:
        self.started = time.monotonic()

    def stop(self) -> None:
        """elapsed() stays what it is now: the run is over."""
        self._ended = time.monotonic()

    def elapsed(self) -> float:
        return (self._ended if self._ended is not None else time.monotonic()) - self.started

    def rate(self, generated_tokens: int) -> float:
        """Generated tokens per second lately (the current speed, not the run's average)."""
        now = time.monotonic()
        samples = self._samples
        samples.append((now, generated_tokens))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_S:
            samples.popleft()
        t0, g0 = samples[0] if now - samples[0][0] > 0.5 else (self.started, 0)
        return (generated_tokens - g0) / max(now - t0, 1e-6)
