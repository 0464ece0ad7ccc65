"""The /metrics figures read at scrape time (metrics.py): prometheus_client custom collectors
over what the server already holds, asking the engine process nothing.

EngineFigures: Engine.stats() (running totals, and slots and queue as of the engine's last
tick; the supervised engine answers it from the parent's own copy) and the restart count.
BatchFigures: every unfinished batch in the catalogue, its lines done of all (the counts the
batch queue writes every half second), and for each batch running now the tokens per second its
lane has generated and an ETA from its pace so far.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .records import UNFINISHED

PREFIX = "llamabatch:"


class EngineFigures(Collector):
    def __init__(self, engine: Any):
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        stats = self.engine.stats()
        yield _gauge("num_requests_running", "Requests in a slot now (prefilling or generating).",
                     stats.slots_prefilling + stats.slots_generating)
        yield _gauge("num_requests_waiting", "Requests queued for a slot.", stats.queue_depth)
        yield _gauge("slots", "Slots (sequences decoded together), --n-parallel.", stats.n_parallel)
        yield _gauge("kv_cells_budget", "KV cells the slots may hold together (slots x tokens per slot).",
                     stats.n_parallel * stats.slot_ctx)
        yield _gauge("kv_cells_used", "KV cells the slots' tokens hold now (of kv_cells_budget).",
                     stats.kv_cells_used)
        yield _counter("prompt_tokens", "Prompt tokens of ended requests (cached ones included).",
                       stats.prompt_tokens)
        yield _counter("cached_prompt_tokens", "Of the prompt tokens, those reused from a slot's or the "
                       "prefix store's KV rather than evaluated.", stats.cached_tokens)
        yield _counter("generation_tokens", "Tokens generated.", stats.generated_tokens)
        yield _counter("num_preemptions", "Requests put aside (their KV kept) for higher-priority ones.",
                       stats.preemptions)
        yield _counter("engine_restarts", "Engine processes started again after a crash (0 in-process).",
                       getattr(self.engine, "restarts", 0))
        outcomes = CounterMetricFamily(PREFIX + "engine_requests", "Requests the engine ended, by outcome "
                                       "(finished: stop or length).", labels=["outcome"])
        for outcome, count in (("finished", stats.finished), ("cancelled", stats.cancelled),
                               ("failed", stats.failed), ("timed_out", stats.timed_out)):
            outcomes.add_metric([outcome], count)
        yield outcomes


class BatchFigures(Collector):
    """`service`: catalogue and running_batch_lanes(); `clock`: the catalogue's clock."""

    def __init__(self, service: Any, clock: Callable[[], float]):
        self.service = service
        self.clock = clock

    def collect(self) -> Iterator[Any]:
        labels = ["batch_id"]
        done = GaugeMetricFamily(PREFIX + "batch_lines_done", "Lines of a batch answered or failed.", labels=labels)
        failed = GaugeMetricFamily(PREFIX + "batch_lines_failed", "Lines of a batch that failed.", labels=labels)
        lines = GaugeMetricFamily(PREFIX + "batch_lines", "Lines in a batch's input file.", labels=labels)
        speed = GaugeMetricFamily(PREFIX + "batch_generation_tokens_per_second",
                                  "Tokens per second a running batch generates (since it started here).",
                                  labels=labels)
        eta = GaugeMetricFamily(PREFIX + "batch_eta_seconds", "Seconds left for a running batch at its pace "
                                "so far (absent until a line is done).", labels=labels)
        lanes = self.service.running_batch_lanes()
        now = self.clock()
        for batch in self.service.catalogue.batches_in(UNFINISHED):
            finished = batch.completed + batch.failed
            done.add_metric([batch.id], finished)
            failed.add_metric([batch.id], batch.failed)
            lines.add_metric([batch.id], batch.total)
            lane = lanes.get(batch.id)
            if lane is not None:
                speed.add_metric([batch.id], lane.generated_tokens / max(time.monotonic() - lane.started, 1e-3))
            started = batch.times.get("in_progress_at")
            if started is not None and finished > 0:
                eta.add_metric([batch.id], max(batch.total - finished, 0) * max(now - started, 0) / finished)
        yield from (done, failed, lines, speed, eta)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, value=value)
