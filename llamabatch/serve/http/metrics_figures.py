"""The /metrics figures read at scrape time (metrics.py): prometheus_client custom collectors
over what the server already holds, asking the engine process nothing.

EngineFigures: Engine.stats() (running totals, and slots and queue as of the engine's last
tick; the supervised engine answers it from the parent's own copy) and the restart count; on Ray
(serve --ray) each worker's state, load and totals as well.
BatchFigures: every unfinished batch in the catalogue, its lines done of all (the counts the
batch queue writes every half second), and for each batch running now the tokens per second its
lane has generated and an ETA from its pace so far.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .batches.records import UNFINISHED

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
        yield from _worker_figures(self.engine)


# serve --ray: a figure per Ray worker (its name and node as labels): (row field, name, help, counter?)
_WORKER_FIGURES = (
    ("up", "ray_worker_up", "1 while the Ray worker serves, 0 while it restarts or after it is gone.", False),
    ("slots", "ray_worker_slots", "Slots of the Ray worker's engine.", False),
    ("inflight", "ray_worker_requests_running", "Requests the Ray worker holds now (in a slot or queued "
     "in its engine).", False),
    ("lines", "ray_worker_requests", "Requests the Ray worker answered.", True),
    ("generated_tokens", "ray_worker_generation_tokens", "Tokens the Ray worker generated.", True),
    ("restarts", "ray_worker_restarts", "Times the Ray worker's process died and was started again.", True),
)


def _worker_figures(engine: Any) -> Iterator[Any]:
    """Per-worker figures of an engine on Ray workers (RayPool.worker_rows); none for one engine."""
    rows = getattr(engine, "worker_rows", None)
    if rows is None:
        return
    workers = [{**row, "up": int(row["state"] == "ready")} for row in rows()]
    for field, name, help_text, counter in _WORKER_FIGURES:
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        family = kind(PREFIX + name, help_text, labels=["worker", "node"])
        for row in workers:
            family.add_metric([row["name"], row["node"]], row[field])
        yield family


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
