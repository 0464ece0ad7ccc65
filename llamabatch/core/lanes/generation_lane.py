"""GenerationLane: text generation as one lane of the engine's tick (work_lane.py).

A step admits waiting requests to slots, asks the Scheduler for the tick's plan, runs it in one
llama_decode (on "no KV room" the scheduler's smaller plan, never a crash), and hands the
tokens to their requests: streamed Deltas, then each request's one Result. Tokens sampled on
sampling threads (sampling_threads.py) are taken at the start of the next step.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterable

from ...errors import DecodeError, InternalError
from ...results import Delta
from ..prefixes.disk_prefix import DiskPrefixes
from .open_requests import OpenRequests
from ..plan import INTERRUPTED, Runner, StepPlan, StepResult
from ..sampling_threads import GRACE, SampleJobRun, SamplingThreads
from ..scheduling.scheduler import PrefixToSave, Scheduler, SeqEvent
from ..sequence import Sequence, Status
from ..telemetry import RequestRecord, TickRecord
from ..tick_interrupt import TickInterrupt

log = logging.getLogger("llamabatch.engine")


def priority_of(scheduler: Scheduler, slot: int) -> int:
    seq = scheduler.slots[slot].seq
    return seq.params.priority if seq is not None else 0


def rows_by_priority(scheduler: Scheduler, plan: StepPlan) -> dict[int, int]:
    """The tick's rows by their request's priority; empty when all are priority 0."""
    rows: dict[int, int] = {}
    for chunk in plan.chunks:
        priority = priority_of(scheduler, chunk.slot)
        rows[priority] = rows.get(priority, 0) + len(chunk.tokens)
    return {} if set(rows) <= {0} else rows


class GenerationLane:
    """The generate requests of an engine, from admission to their Result. `waiting` (the
    requests submitted and not yet given a slot) is shared with submit, under `cond`."""

    def __init__(self, runner: Runner, scheduler: Scheduler, requests: OpenRequests, cond: threading.Condition, *,
                 sampling_threads: SamplingThreads | None, disk: DiskPrefixes | None,
                 tick_interrupt: TickInterrupt, queued_priorities: Callable[[], Iterable[int]],
                 next_tick: Callable[[], int]):
        """`queued_priorities` gives, under `cond`, the priorities of the generate requests
        submitted since the last tick (an urgent one may stop the decode about to start)."""
        self.runner = runner
        self.scheduler = scheduler
        self.requests = requests
        self.telemetry = requests.telemetry
        self._cond = cond
        self.sampling_threads = sampling_threads
        self.disk = disk
        self._tick_interrupt = tick_interrupt
        self._queued_priorities = queued_priorities
        self._next_tick = next_tick  # the tick numbers both lanes' records share
        self.waiting = 0  # submitted, not yet given a slot (stats)
        self._preemptions = 0  # requests parked since the last tick record

    # -- the lane (work_lane.py) --------------------------------------------------------------

    def take(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def cancel(self, seq: Sequence) -> None:
        if not seq.finished:
            self._end(seq, "cancelled")  # every sample of an n-request

    def expire(self, now: float) -> None:
        for seq in self.scheduler.expired(now):
            self._end(seq, "timeout")

    def next_deadline(self) -> float | None:
        return self.scheduler.next_deadline()

    def has_work(self) -> bool:
        # a token sampled apart that has landed is work too: its request moves on with it
        return self.scheduler.has_work() or bool(self.sampling_threads and self.sampling_threads.has_landed)

    def end_all(self, reason: str, error: str | None = None, code: str | None = None) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if not seq.finished:
                self._end(seq, reason, error, code)

    def close(self) -> None:
        if self.sampling_threads is not None:  # they use chains and the vocabulary: stopped before the runner
            for run in self.sampling_threads.close():
                for sampler in self.sampling_threads.orphans_of(run):
                    self.runner.free_sampler(sampler)

    def step(self, tick_start: float) -> None:
        self._take_threaded_samples()
        self._admit()
        plan = self.scheduler.schedule()
        t_planned = time.perf_counter()
        if plan:
            self._generate(plan, tick_start, t_planned)

    # -- a step ------------------------------------------------------------------------------

    def _admit(self) -> None:
        admitted = self.scheduler.admit()
        parked = self.scheduler.take_preempted()  # put aside for higher-priority requests: waiting again
        if parked:
            self._preemptions += len(parked)
            with self._cond:
                self.waiting += len(parked)
        for seq, slot, reuse, _fork in admitted:
            resumed = seq.kv.parked is not None
            # the slot's KV change (a Trim to `reuse`, a Fork or a Restore) rides on this tick's plan
            self.scheduler.start(seq, slot, reuse)
            if seq.index == 0:  # samples 1..n-1 ride along with sample 0 (the one queued and counted)
                with self._cond:
                    self.waiting -= 1
                if not resumed:
                    self.telemetry.record_request(RequestRecord("start", seq.request_id))

    def _generate(self, plan: StepPlan, t_start: float, t_planned: float) -> None:
        active = len(self.scheduler.running)
        with self.sampling_threads.decoding() if self.sampling_threads else contextlib.nullcontext():
            plan, result = self._execute(plan)
        events = self.scheduler.update(plan, result)
        for wanted in self.scheduler.take_saves():  # before any event ends a request and frees its slot
            self._save(wanted)
        # recorded before any event is delivered, so a caller who has its result sees the tick in stats();
        # the forced tokens requests took: a forced run cut by a stop or max_tokens counts only its kept part
        self._record_tick(plan, result, active, t_start, t_planned, forced=sum(e.forced for e in events),
                          accepted=sum(e.accepted for e in events))
        for event in events:
            self._deliver(event)
        for slot, (error, code) in result.failed.items():
            seq = self.scheduler.slots[slot].seq
            if seq is not None and not seq.finished:
                self._end(seq, "error", error, code)
        if result.apart:
            self._launch(plan, result)

    def _save(self, wanted: PrefixToSave) -> None:
        """Snapshot a slot that holds exactly a prefix worth keeping, on this thread (a copy of
        its KV: milliseconds), and queue the write on the store's own thread."""
        try:
            payload = self.runner.snapshot(wanted.slot)
        except Exception:  # the save is an optimisation: a failure never touches the request
            log.exception("could not snapshot slot %d for the prefix store", wanted.slot)
            return
        name = self.disk.save(wanted.tokens, payload)  # type: ignore[union-attr]
        if wanted.seq.params.store_prefix:
            wanted.seq.kv.stored_prefix = name

    def _execute(self, plan: StepPlan) -> tuple[StepPlan, StepResult]:
        """One llama_decode; on 'no KV room' try the scheduler's smaller plan, never crash."""
        # the first try applies the plan's restores, trims and forks; a smaller plan carries none
        restored = emptied = None
        while True:
            result = self._execute_interruptibly(plan)
            if restored is None:
                restored, emptied = result.restored, result.emptied
                plan = plan.without_slots(emptied)  # the runner evaluated none of their chunks
            if result.status == 0:
                result.restored, result.emptied = restored, emptied
                return plan, result
            if result.status == INTERRUPTED:  # nothing of it ran: the next tick plans again (tick_interrupt.py)
                return StepPlan(), StepResult(eval_ms=result.eval_ms, restored=restored, emptied=emptied,
                                              interrupted=True)
            smaller = self.scheduler.shrink(plan) if result.status == 1 else None
            if smaller is None:
                self._fail_batch(plan, result.status)
                return StepPlan(), StepResult(eval_ms=result.eval_ms, restored=restored, emptied=emptied)
            plan = smaller

    def _execute_interruptibly(self, plan: StepPlan) -> StepResult:
        best = None
        rows = [self.scheduler.slots[chunk.slot].seq for chunk in plan.chunks]
        # a tick with a fair-share request's rows is never interrupted, or a stream of higher
        # arrivals, one each tick, would stop every tick it has (no starvation: admission.py)
        if self.runner.interruptible(plan) and not any(seq is not None and seq.queue.protected for seq in rows):
            best = min(priority_of(self.scheduler, chunk.slot) for chunk in plan.chunks)
        runs = self.runner.graph_runs([(c.slot, len(c.tokens)) for c in plan.chunks]) if best is not None else 0
        with self._cond:
            self._tick_interrupt.arm(best, self._queued_priorities(), runs)
        try:
            result = self.runner.execute(plan)
        finally:
            with self._cond:
                self._tick_interrupt.disarm()
        if result.status == 0:
            self._tick_interrupt.observe(result.eval_ms, result.ubatches)
        return result

    def _fail_batch(self, plan: StepPlan, status: int) -> None:
        """End every request in a plan llama_decode refused; their slots' KV is emptied by
        Trims that the next plan carries (Scheduler.forget_slot)."""
        why = "no room left in the KV cache" if status == 1 else f"llama_decode returned {status}"
        for chunk in plan.chunks:
            seq = self.scheduler.slots[chunk.slot].seq
            self.scheduler.forget_slot(chunk.slot)
            if seq is not None and not seq.finished:
                self._end(seq, "error", str(DecodeError(why)), DecodeError.code)

    def _record_tick(self, plan: StepPlan, result: StepResult, active: int, t_start: float,
                     t_planned: float, forced: int = 0, accepted: int = 0) -> None:
        wall = (time.perf_counter() - t_start) * 1000
        if self.scheduler.speculation is not None and plan.chunks:  # what a tick costs here, for choosing guesses
            logit_rows = sum(1 + c.n_draft for c in plan.chunks if c.wants_logits)
            self.scheduler.speculation.cost.observe(result.ubatches, plan.n_tokens, logit_rows,
                                                    result.eval_ms + result.sample_ms)
        plan_ms = (t_planned - t_start) * 1000
        overhead = max(0.0, wall - result.eval_ms - result.sample_ms)
        preemptions, self._preemptions = self._preemptions, 0
        self.telemetry.record_tick(TickRecord(
            preemptions=preemptions, rows_by_priority=rows_by_priority(self.scheduler, plan),
            interrupted=result.interrupted,
            tick=self._next_tick(), batch_size=plan.n_tokens, decode_tokens=plan.decode_tokens,
            prefill_tokens=plan.prefill_tokens, active_slots=active,
            queue_depth=len(self.scheduler.waiting), eval_ms=result.eval_ms, sample_ms=result.sample_ms,
            overhead_ms=overhead, wall_ms=wall, plan_ms=plan_ms, fill_ms=result.fill_ms,
            after_ms=max(0.0, overhead - plan_ms - result.fill_ms), ubatches=result.ubatches,
            forced_tokens=forced, drafted_tokens=plan.draft_tokens, accepted_tokens=accepted,
            moves=len(plan.moves)))

    # -- tokens sampled on sampling threads ------------------------------------------------------

    def _launch(self, plan: StepPlan, result: StepResult) -> None:
        """Start the tick's SampleJobs, then wait a little: a cheap grammar's token still makes
        this tick, a slow one's slot skips ticks until it lands (see sampling_threads.py)."""
        assert self.sampling_threads is not None
        runs = []
        for chunk in plan.chunks:
            job = result.apart.get(chunk.slot)
            if job is not None:
                runs.append(self.sampling_threads.launch(self.scheduler.slots[chunk.slot].seq, chunk, job))
        waited = self.sampling_threads.wait(runs, GRACE * result.eval_ms / 1000)
        result.sample_ms += waited * 1000
        self._take_threaded_samples()

    def _take_threaded_samples(self) -> None:
        """Take the tokens sampled apart since the last look; free the chains of requests that
        ended while their token was in run."""
        if self.sampling_threads is None:
            return
        for run in self.sampling_threads.take_landed():
            self._apply_threaded_sample(run)

    def _apply_threaded_sample(self, run: SampleJobRun) -> None:
        for sampler in self.sampling_threads.orphans_of(run):  # type: ignore[union-attr]
            self.runner.free_sampler(sampler)
        seq = run.seq
        if seq.finished or run.outcome is None and run.error is None:
            return  # ended (cancel, timeout, close) while its token was in run
        if run.error is not None:
            self._end(seq, "error", str(InternalError(f"sampling failed: {type(run.error).__name__}: "
                                                       f"{run.error}")), InternalError.code)
            return
        sampled, logprobs = run.outcome  # type: ignore[misc]
        for event in self.scheduler.accept_apart(run.chunk, sampled, logprobs):
            self._deliver(event)

    # -- outcomes ------------------------------------------------------------------------------

    def _deliver(self, event: SeqEvent) -> None:
        seq = event.seq
        if event.text or event.tokens or event.reasoning:
            self.requests.deliver(seq.request_id, Delta(event.text, event.tokens, seq.index, event.reasoning))
        if event.finished:
            self._complete(seq)

    def _end(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> None:
        """End a sequence from outside the token flow (cancel, timeout, failure). The samples of
        an n-request end together: one request, one outcome."""
        for member in [seq, *(m for m in seq.members if m is not seq)]:
            if member.finished:
                continue
            was_waiting = member.status == Status.WAITING and member.index == 0  # only sample 0 is queued
            tail, reasoning = self.scheduler.finish(member, reason, error, code)
            if was_waiting:
                with self._cond:
                    self.waiting -= 1
            if tail or reasoning:
                self.requests.deliver(member.request_id, Delta(tail, [], member.index, reasoning))
            self._complete(member)

    def _release(self, sampler: Any) -> None:
        """Free a finished request's chain, or, while a sampling thread still uses it, stop that
        job and free the chain when it lands (freeing it under a running job would crash)."""
        if sampler is None:
            return
        if self.sampling_threads is not None and self.sampling_threads.holds(sampler):
            self.sampling_threads.release_later(sampler)
        else:
            self.runner.free_sampler(sampler)

    def _complete(self, seq: Sequence) -> None:
        self._release(seq.sampler)
        seq.sampler = None
        seq.completed = True
        if not all(m.completed for m in seq.members):
            return  # an n-request's Result waits for its last sample
        result = seq.request_result()
        result.deterministic = self.requests.deterministic
        self.requests.finish(seq.request_id, result)
