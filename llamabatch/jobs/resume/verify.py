"""Checking a finished run: re-run a random sample of its requests one at a time and compare
tokens (`llamabatch run --verify N`). In deterministic mode every re-run must give the same
tokens as the batched run; any difference is a broken promise, reported by id.
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any, Hashable

from ...results import Result


@dataclass
class Sample:
    key: Hashable  # what the report names (the line's id)
    prompt: Any
    params: Any  # SamplingParams, with the seed the first run used
    token_ids: list[int]


@dataclass
class Difference:
    key: Hashable
    why: str  # "first difference at token 5 (of 12 / 12)" or how the re-run ended


class Reservoir:
    """A uniform random sample of up to `n` finished requests, offered one by one from any
    thread (reservoir sampling: memory stays at n however long the run)."""

    def __init__(self, n: int, seed: int = 0):
        self.n = n
        self.seen = 0
        self.samples: list[Sample] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def offer(self, key: Hashable, prompt: Any, params: Any, result: Result) -> None:
        if result.finish_reason not in ("stop", "length"):
            return  # errors, timeouts and cancels have no tokens to compare
        sample = Sample(key, prompt, params.replace(seed=result.seed), list(result.token_ids))
        with self._lock:
            self.seen += 1
            if len(self.samples) < self.n:
                self.samples.append(sample)
            else:
                j = self._rng.randrange(self.seen)
                if j < self.n:
                    self.samples[j] = sample


def rerun_alone(engine: Any, samples: list[Sample]) -> list[Difference]:
    """Submit each sample alone (waiting for it before the next) and compare its tokens."""
    differences = []
    for sample in samples:
        result = engine.submit(sample.prompt, sample.params, stream=False).result()
        if result.finish_reason not in ("stop", "length"):
            differences.append(Difference(sample.key, f"re-run ended with {result.finish_reason}"
                                          + (f": {result.error}" if result.error else "")))
        elif result.token_ids != sample.token_ids:
            differences.append(Difference(sample.key, _first_difference(sample.token_ids, result.token_ids)))
    return differences


def _first_difference(a: list[int], b: list[int]) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at token {i} ({len(a)} tokens in the run, {len(b)} alone)"
