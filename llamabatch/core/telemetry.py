"""Telemetry as data: per-tick and per-request records, running totals, subscribers.

The engine never prints. Front ends (bench tables, progress bars, serve-stdin stats)
subscribe callbacks or read `Telemetry.snapshot()`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

log = logging.getLogger("llamabatch.telemetry")


@dataclass
class TickRecord:
    tick: int
    batch_size: int
    decode_tokens: int
    prefill_tokens: int
    active_slots: int
    queue_depth: int
    eval_ms: float  # llama_decode (synchronised)
    sample_ms: float  # llama_sampler_sample for every row, in C
    overhead_ms: float  # everything else: scheduling, batch filling, detokenizing, delivery
    wall_ms: float
    # overhead_ms by where it goes (bench --verbose's trace): before the plan exists (cancels,
    # timeouts, admission, scheduling), writing the llama_batch, after the decode (stops,
    # detokenizing, delivery, telemetry)
    plan_ms: float = 0.0
    fill_ms: float = 0.0
    after_ms: float = 0.0
    ubatches: int = 0  # graph runs llama_decode made of the tick's batch
    forced_tokens: int = 0  # tokens grammars forced after this tick's samples (evaluated next tick, unsampled)
    # speculative decoding: guesses this tick verified (rows of its batch), and those that joined answers
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    # priority (core/scheduling/scheduler.py): requests preempted before this tick, and the tick's rows by
    # the priority of the request they belong to (empty when every row has priority 0)
    preemptions: int = 0
    rows_by_priority: dict[int, int] = field(default_factory=dict)
    # the tick's decode was stopped part-way for a request that outranked every row of it
    # (core/tick_interrupt.py): nothing of it was kept, its rows run again in a later tick
    interrupted: bool = False
    # requests moved into an idle slot below them before this tick's decode (a whole KV stream
    # copied each: plan.Move), so the busy slots stay consecutive
    moves: int = 0
    at: float = field(default_factory=time.perf_counter)

    kind = "tick"

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items() if k != "at"}


@dataclass
class RequestRecord:
    kind: str  # "start" | "done" | "exception"
    request_id: int
    finish_reason: str | None = None
    usage: Any = None
    timings: Any = None
    error: str | None = None
    at: float = field(default_factory=time.perf_counter)
    grammar_backend: str | None = None  # how its grammar constrained it ("llguidance", "llama"), if it had one


@dataclass
class Totals:
    submitted: int = 0
    finished: int = 0  # stop or length
    cancelled: int = 0
    failed: int = 0
    timed_out: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    ticks: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    forced_tokens: int = 0  # grammars' forced tokens (llama/sampling/mask_grammar.py), part of generated_tokens
    drafted_tokens: int = 0  # guesses verified (speculative decoding, core/drafts.py)
    accepted_tokens: int = 0  # of them, those that joined answers (part of generated_tokens)
    preemptions: int = 0  # requests put aside for higher-priority ones (their KV kept, resumed later)
    interrupted_ticks: int = 0  # decodes stopped part-way for a request that outranked all their rows
    moves: int = 0  # requests moved into an idle slot below them (plan.Move: a KV stream copied each)
    eval_ms: float = 0.0
    sample_ms: float = 0.0
    overhead_ms: float = 0.0


@dataclass
class EngineStats(Totals):
    """`Engine.stats()`: every running total, plus the slots and queue right now."""

    slots_idle: int = 0
    slots_prefilling: int = 0
    slots_generating: int = 0
    queue_depth: int = 0
    n_parallel: int = 0
    reserved_slots: int = 0  # of n_parallel, those only requests above the default priority take
    slot_ctx: int = 0
    kv_cells_used: int = 0  # tokens the slots hold in the KV cache now (of n_parallel x slot_ctx)
    uptime_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Subscriber = Callable[[Any], None]


class Telemetry:
    def __init__(self, keep_ticks: int = 4096):
        self.totals = Totals()
        self.recent_ticks: deque[TickRecord] = deque(maxlen=keep_ticks)
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self.started_at = time.perf_counter()

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(record)` for every TickRecord and RequestRecord, on the engine thread."""
        with self._lock:
            self._subscribers = [*self._subscribers, callback]

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [s for s in self._subscribers if s is not callback]

        return unsubscribe

    def _emit(self, record: Any) -> None:
        for callback in self._subscribers:
            try:
                callback(record)
            except Exception:  # a faulty subscriber must not take the engine down
                log.exception("telemetry subscriber failed")

    def stats(self, slot_states: list[str], queue_depth: int, slot_ctx: int, reserved_slots: int = 0,
              kv_cells_used: int = 0) -> EngineStats:
        """The totals so far with the given slot states ("idle", "prefilling", "generating")."""
        return EngineStats(**asdict(self.totals), slots_idle=slot_states.count("idle"),
                           slots_prefilling=slot_states.count("prefilling"),
                           slots_generating=slot_states.count("generating"), queue_depth=queue_depth,
                           n_parallel=len(slot_states), reserved_slots=reserved_slots, slot_ctx=slot_ctx,
                           kv_cells_used=kv_cells_used,
                           uptime_s=round(time.perf_counter() - self.started_at, 3))

    def record_tick(self, record: TickRecord) -> None:
        t = self.totals
        t.ticks += 1
        t.decode_tokens += record.decode_tokens
        t.prefill_tokens += record.prefill_tokens
        t.forced_tokens += record.forced_tokens
        t.drafted_tokens += record.drafted_tokens
        t.accepted_tokens += record.accepted_tokens
        t.preemptions += record.preemptions
        t.interrupted_ticks += record.interrupted
        t.moves += record.moves
        t.eval_ms += record.eval_ms
        t.sample_ms += record.sample_ms
        t.overhead_ms += record.overhead_ms
        self.recent_ticks.append(record)
        if self._subscribers:
            self._emit(record)

    def record_request(self, record: RequestRecord) -> None:
        t = self.totals
        if record.kind != "start":
            reason = record.finish_reason
            if reason in ("stop", "length"):
                t.finished += 1
            elif reason == "cancelled":
                t.cancelled += 1
            elif reason == "timeout":
                t.timed_out += 1
            else:
                t.failed += 1
            if record.usage is not None:
                t.prompt_tokens += record.usage.prompt_tokens
                t.cached_tokens += record.usage.cached_tokens
                t.generated_tokens += record.usage.completion_tokens
        if self._subscribers:
            self._emit(record)
