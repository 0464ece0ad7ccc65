"""EmbeddingLane: embeddings requests as one lane of the engine's tick (work_lane.py).

Each tick it has inputs waiting, it packs the next batch from its EmbedQueue (core/embedding.py),
has the runner pool it in one llama_decode of the embedding context (llama/embedder.py), and
ends the requests whose last vector came back. It takes its own decode after generation's,
so each kind of work moves every tick.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ...errors import DecodeError
from ...results import EmbeddingResult
from ..embedding import EmbedJob, EmbedQueue
from ..engine_base import error_result
from .open_requests import OpenRequests
from ..plan import EmbedBatch
from ..telemetry import RequestRecord, TickRecord


class EmbeddingLane:
    """The embeddings requests accepted and not yet ended, and the step that moves them."""

    def __init__(self, runner: Any, requests: OpenRequests, next_tick: Callable[[], int]):
        self.runner = runner
        self.requests = requests
        self.next_tick = next_tick  # the tick numbers both lanes' records share
        self.embeds = EmbedQueue()

    def take(self, job: EmbedJob) -> None:
        self.embeds.add(job)

    def cancel(self, job: EmbedJob) -> None:
        if not job.finished:
            self._end(job, "cancelled")

    def expire(self, now: float) -> None:
        for job in self.embeds.expired(now):
            self._end(job, "timeout")

    def next_deadline(self) -> float | None:
        return self.embeds.next_deadline()

    def has_work(self) -> bool:
        return self.embeds.has_work()

    def end_all(self, reason: str, error: str | None = None, code: str | None = None) -> None:
        for job in list(self.embeds.jobs):
            self._end(job, reason, error, code)

    def close(self) -> None:
        pass  # nothing runs beside the engine thread for embeddings

    def step(self, tick_start: float) -> None:
        """One batch of inputs through the embedding context (its wall is its own, not the tick's)."""
        if not self.embeds.has_work():
            return
        t_start = time.perf_counter()
        pooling, items = self.embeds.take(self.runner.embed_max_tokens, self.runner.embed_max_seqs)
        jobs = list(dict.fromkeys(item.job for item in items))  # in order, once each
        for item in items:
            if item.index == 0:  # the request's first batch: it has started
                self.requests.telemetry.record_request(RequestRecord("start", item.job.request_id))
        batch = EmbedBatch(pooling, [item.job.tokens[item.index] for item in items])
        result = self.runner.embed(batch)
        if result.status != 0:
            why = result.error or ("no room in the embedding context" if result.status == 1
                                   else f"llama_decode returned {result.status}")
            error, code = (why, result.code) if result.code else (str(DecodeError(why)), DecodeError.code)
            for job in jobs:
                if not job.finished:
                    self._end(job, "error", error, code)
        else:
            for item, vector in zip(items, result.vectors):
                item.job.take_vector(item.index, vector)
            for job in jobs:
                if job.complete and not job.finished:
                    self._end(job, "stop")
        wall = (time.perf_counter() - t_start) * 1000
        self.requests.telemetry.record_tick(TickRecord(
            tick=self.next_tick(), batch_size=batch.n_tokens, decode_tokens=0, prefill_tokens=batch.n_tokens,
            active_slots=len(items), queue_depth=len(self.embeds.jobs), eval_ms=result.eval_ms, sample_ms=0.0,
            overhead_ms=max(0.0, wall - result.eval_ms), wall_ms=wall))

    def _end(self, job: EmbedJob, reason: str, error: str | None = None, code: str | None = None) -> None:
        """The one terminal outcome of an embeddings request: its vectors ("stop") or none."""
        job.finished = True
        self.embeds.remove(job)
        deterministic = self.requests.deterministic
        if reason == "stop":
            result = job.result(deterministic)
        else:
            result = EmbeddingResult.ended(error_result(job.request_id, error or "", code or "",
                                                        deterministic=deterministic))
            result.finish_reason, result.error, result.error_code = reason, error, code
        self.requests.finish(job.request_id, result)
