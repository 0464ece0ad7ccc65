"""Sampling apart from the tick: one request's costly sampler must not set every request's pace.

Every slot's token is sampled after the tick's one llama_decode, so a request whose sampler
is slow holds up every other slot's next token. The cost that matters is llama.cpp's grammar
sampler: it checks every token of the vocabulary against every grammar stack, so with
Gemma 3's 262,144 tokens even a one-line grammar costs tens of milliseconds a token, and a
JSON-schema enum of 10,000 strings (10,000 stacks) costs seconds to a minute a token.

So requests with a grammar or a json_schema are sampled here, on sampling threads: the
runner copies the row's logits and returns a SampleJob instead of a token; their slot skips
ticks until the job lands, and the other slots decode meanwhile. The engine waits for the
jobs a tick started for at most GRACE × that tick's llama_decode time, so a cheap grammar
still gets its token in the same tick and the others' tick grows by at most that fraction.

A cancel or timeout ends the request at once; its job is told to stop (it checks between
slices of the vocabulary) and its sampler chains are freed only when the job has returned.

When llama_decode's threads take every core (threads >= CPUs, the default on a small
machine), a sampling thread running beside them does not just take its share: ggml's
threads meet at a barrier after every operation, so each time one of them is preempted the
other waits, and a low-priority thread still slowed the others' decode 2-4x on 2 CPUs
(benchmarks/slow_grammar.py). There the jobs pause at their next slice (about 2 ms) while
the engine thread runs llama_decode, and work in between and when nothing else decodes.

Deterministic mode samples inline: its promise is about tokens, not pace, and keeping the
tick's shape independent of thread timing keeps that promise easy to check.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..params import SamplingParams
from .plan import Chunk, SampleJob, SampleStopped

log = logging.getLogger("llamabatch.apart")

GRACE = 0.5  # of the tick's llama_decode time: how long a tick waits for the jobs it started
SAMPLER_NICE = 10  # sampling threads yield the CPU to llama_decode's threads (Linux: per thread)
THREAD_NAME = "llamabatch-samp"  # sampling threads' OS-level name (Linux keeps 15 bytes)


def wants_apart(params: SamplingParams, sampler: Any = None) -> bool:
    """Which requests are sampled apart: those with a grammar in llama.cpp's sampler (whose
    cost grows with the vocabulary times the grammar's alternatives). The rest sample inline,
    cheaply; so do grammars applied as a token mask (llama/sampling/mask_grammar.py: tens of
    microseconds a step), whose slots then never skip a tick waiting for their token."""
    if getattr(sampler, "matcher", None) is not None:
        return False
    return bool(params.grammar) or params.json_schema is not None


@dataclass(eq=False)
class SampleJobRun:
    """One SampleJob run for `seq` (an engine Sequence) on a sampling thread: from launch
    until it lands with its outcome (or error) and the engine takes it."""

    seq: Any
    chunk: Chunk
    job: SampleJob
    launched_at: float = field(default_factory=time.perf_counter)
    stop: bool = False  # set by the engine thread: the request ended, give up
    landed: bool = False
    outcome: tuple[dict[int, int], dict[int, dict]] | None = None  # (sampled, logprobs)
    error: BaseException | None = None


def _prepare_thread() -> None:
    # A slow grammar must not take the cores llama_decode's threads run on: on a small
    # machine that would slow every other request again, the thing this module prevents.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SAMPLER_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: run at normal priority
        pass
    # The OS-level name (top -H, /proc; at most 15 bytes), so its CPU time can be told apart
    # from llama_decode's (benchmarks/slow_grammar.py reads it).
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(THREAD_NAME)
    except (AttributeError, OSError):
        pass


class SamplingThreads:
    """Runs SampleJobs on sampling threads; lands their results for the engine thread.

    `cond` is the engine's condition: a landing job notifies it, so an engine waiting for
    work wakes. Everything here except the jobs' own work happens under it."""

    def __init__(self, cond: threading.Condition, max_threads: int, yield_to_decode: bool = False):
        self._cond = cond
        self.yield_to_decode = yield_to_decode
        self._quiet = threading.Event()  # clear while the engine thread runs llama_decode
        self._quiet.set()
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_threads), thread_name_prefix="llamabatch-sample",
                                        initializer=_prepare_thread)
        self._flying: dict[Any, SampleJobRun] = {}  # seq -> its run (a slot has one token in run at most)
        self._landed: list[SampleJobRun] = []
        self._orphans: set[int] = set()  # ids of sampler chains whose request ended mid-run
        self._closed = False

    def launch(self, seq: Any, chunk: Chunk, job: SampleJob) -> SampleJobRun:
        run = SampleJobRun(seq, chunk, job)
        with self._cond:
            self._flying[seq] = run
        self._pool.submit(self._run, run)
        return run

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """Around the engine thread's llama_decode: with yield_to_decode, jobs pause meanwhile."""
        if not self.yield_to_decode:
            yield
            return
        self._quiet.clear()
        try:
            yield
        finally:
            self._quiet.set()

    def _checkpoint(self, run: SampleJobRun) -> bool:
        """A job's `stop()`: True when it should give up; holds it while a decode runs."""
        while not run.stop and not self._quiet.is_set():
            self._quiet.wait(0.05)  # a cancel meanwhile is seen within this
        return run.stop

    def _run(self, run: SampleJobRun) -> None:
        try:
            run.outcome = run.job.run(lambda: self._checkpoint(run))
        except SampleStopped:
            pass
        except BaseException as exc:  # this request's failure, never the sampling thread's end
            log.exception("sampling apart failed for request %s", run.chunk.request_id)
            run.error = exc
        with self._cond:
            run.landed = True
            self._landed.append(run)
            self._cond.notify_all()

    def wait(self, runs: list[SampleJobRun], seconds: float) -> float:
        """Wait (engine thread) until `runs` have landed or `seconds` pass; the time waited."""
        start = time.perf_counter()
        until = start + seconds
        with self._cond:
            while not all(f.landed for f in runs):
                left = until - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
        return time.perf_counter() - start

    def take_landed(self) -> list[SampleJobRun]:
        """The runs that landed since the last call, in landing order."""
        with self._cond:
            out, self._landed = self._landed, []
            for run in out:
                self._flying.pop(run.seq, None)
        return out

    @property
    def has_landed(self) -> bool:  # called under the engine's condition
        return bool(self._landed)

    @property
    def busy(self) -> bool:
        return bool(self._flying)

    def holds(self, sampler: Any) -> bool:
        """Whether a job in run (landed or not, until taken) uses `sampler`."""
        with self._cond:
            return any(sampler is s for f in self._flying.values() for s in f.job.samplers)

    def release_later(self, sampler: Any) -> None:
        """`sampler`'s request ended while a job uses it: stop that job; the engine frees the
        chain when the job lands (`orphans_of`), never under a running job."""
        with self._cond:
            self._orphans.add(id(sampler))
            for run in self._flying.values():
                if any(sampler is s for s in run.job.samplers):
                    run.stop = True

    def orphans_of(self, run: SampleJobRun) -> list[Any]:
        """The chains of a landed run whose request has ended: now safe to free."""
        out = [s for s in run.job.samplers if id(s) in self._orphans]
        for s in out:
            self._orphans.discard(id(s))
        return out

    def close(self) -> list[SampleJobRun]:
        """Stop every job, wait for the sampling threads (each stops within one slice of its
        work), and return the runs not yet taken, for their chains to be freed."""
        with self._cond:
            self._closed = True
            for run in self._flying.values():
                run.stop = True
        self._pool.shutdown(wait=True)
        return self.take_landed()
