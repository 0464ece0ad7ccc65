"""GET /metrics: the server's figures in Prometheus' text format, through prometheus_client.

Each server has a CollectorRegistry of its own (not prometheus_client's global one), so servers
in one process (tests) never share or clash over a name. Two kinds of figures:

- kept here as requests end: the latency histograms and the prefix-store hits, fed by the
  engine's telemetry (every request, online and batch lines alike), and the HTTP request
  counter by endpoint and outcome, fed by the online endpoints;
- read at scrape time from what the server already holds (metrics_figures.py): the engine's
  running totals and slot states (Engine.stats(), which never asks the engine process), its
  restarts, and each unfinished batch from the catalogue.

Names take vLLM's `vllm:` shape with a `llamabatch:` prefix; docs/serve.md#metrics lists them
with their vLLM and llama-server counterparts. Scraping runs in a worker thread and waits on
nothing the engine does, so a hung engine process never hangs a scrape.
"""
from __future__ import annotations

from typing import Any, Callable

from anyio import to_thread
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import Response

from ...core.telemetry import RequestRecord
from .metrics_figures import BatchFigures, EngineFigures

METRICS_PATH = "/metrics"
PREFIX = "llamabatch:"
REFUSED = "refused"  # an online request's outcome when it never reached the engine (bad body, queue full)

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for vLLM read these unchanged
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
ANSWERED = ("stop", "length")  # finish reasons of a request that has an answer: the latencies describe those


class ServerMetrics:
    """One server's registry. `service`: what the figures are read from (its engine, catalogue,
    running batch lanes); `clock`: the catalogue's clock (batch times are in its seconds)."""

    def __init__(self, service: Any, clock: Callable[[], float] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(PREFIX + "http_requests", "Online HTTP requests by endpoint and outcome "
                                     "(the finish reason, or 'refused' when the engine never got it).",
                                     ["endpoint", "outcome"], registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token (submitted -> "
                              "first token sampled), in seconds.", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds", "Mean time per output token after "
                              "the first, per request, in seconds.", buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "End-to-end request latency (submitted "
                             "-> last token), in seconds.", buckets=E2E_BUCKETS, registry=r)
        self.prefix_hits = Counter(PREFIX + "prefix_store_hits", "Requests whose prompt KV was restored from "
                                   "the disk prefix store.", registry=r)
        self.prefix_tokens = Counter(PREFIX + "prefix_store_restored_tokens", "Prompt tokens restored from "
                                     "the disk prefix store.", registry=r)
        r.register(EngineFigures(service.engine))
        r.register(BatchFigures(service, clock or service.clock))
        self._unsubscribe = service.engine.subscribe(self._record)

    def close(self) -> None:
        self._unsubscribe()

    def request_ended(self, endpoint: str, result: Any) -> None:
        """An online request's end: its terminal Result, or None when it was refused."""
        outcome = REFUSED if result is None else getattr(result, "finish_reason", None) or "error"
        self.http_requests.labels(endpoint, outcome).inc()

    def _record(self, record: Any) -> None:
        # on the engine's thread: a histogram's observe is a lock and an add
        if not isinstance(record, RequestRecord) or record.kind == "start":
            return
        usage, timings = record.usage, record.timings
        if usage is not None and getattr(usage, "restored_tokens", 0):
            self.prefix_hits.inc()
            self.prefix_tokens.inc(usage.restored_tokens)
        if record.finish_reason not in ANSWERED or usage is None or timings is None:
            return
        generated = usage.completion_tokens
        if generated > 0:
            self.ttft.observe(timings.ttft_ms / 1000)
            self.e2e.observe((timings.ttft_ms + timings.decode_ms) / 1000)
        if generated > 1:
            self.tpot.observe(timings.decode_ms / 1000 / (generated - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def metrics_answer(metrics: ServerMetrics) -> Response:
    # in a worker thread: the catalogue read is a (short) SQLite query, kept off the event loop
    body = await to_thread.run_sync(metrics.render)
    return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST})
