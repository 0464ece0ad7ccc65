"""EngineConfig: how the engine is built (model, slots, context, batch shape, policy)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .errors import InvalidRequest

POLICIES = ("decode-maximal", "prefill-priority", "balanced")
DEFAULT_CTX_PER_SLOT = 4096


@dataclass
class EngineConfig:
    """Settings fixed for an engine's lifetime.

    `model=None` means the bundled Gemma 3 270M (see `models.resolve_model`).
    `n_ctx=None` gives every slot 4096 tokens: n_ctx = 4096 * n_parallel.
    """

    model: str | None = None
    n_parallel: int = 8
    n_ctx: int | None = None
    n_batch: int = 512
    chunk_size: int = 256
    threads: int | None = None
    policy: str = "decode-maximal"
    cache_prompt: bool = True
    n_gpu_layers: int = 0
    max_queue: int = 0
    chat_template: str | None = None  # a built-in NAME or a Jinja FILE; None = the GGUF's own or a fallback
    seed: int | None = None  # engine-wide default seed for requests that set none (None = random)

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    @property
    def total_ctx(self) -> int:
        return self.n_ctx if self.n_ctx else DEFAULT_CTX_PER_SLOT * self.n_parallel

    @property
    def slot_ctx(self) -> int:
        """Tokens one slot may hold: llama.cpp splits the KV cache evenly between sequences."""
        return self.total_ctx // self.n_parallel

    @property
    def n_threads(self) -> int:
        return self.threads or max(1, min(os.cpu_count() or 1, 8))

    def validate(self) -> "EngineConfig":
        def bad(name: str, allowed: str, got) -> None:
            raise InvalidRequest(f"{name} must be {allowed}, got {got!r}")

        if not isinstance(self.n_parallel, int) or self.n_parallel < 1:
            bad("n_parallel", "an integer >= 1", self.n_parallel)
        if self.n_ctx is not None and (not isinstance(self.n_ctx, int) or self.n_ctx < 16 * self.n_parallel):
            bad("n_ctx", f"an integer >= 16 per slot ({16 * self.n_parallel} for {self.n_parallel} slots)", self.n_ctx)
        if not isinstance(self.n_batch, int) or self.n_batch < self.n_parallel:
            bad("n_batch", f"an integer >= n_parallel ({self.n_parallel})", self.n_batch)
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            bad("chunk_size", "an integer >= 1", self.chunk_size)
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            bad("threads", "an integer >= 1", self.threads)
        if self.policy not in POLICIES:
            bad("policy", "one of " + ", ".join(POLICIES), self.policy)
        if not isinstance(self.n_gpu_layers, int) or self.n_gpu_layers < -1:
            bad("n_gpu_layers", "an integer >= -1 (-1 = all)", self.n_gpu_layers)
        if not isinstance(self.max_queue, int) or self.max_queue < 0:
            bad("max_queue", "an integer >= 0 (0 = unbounded)", self.max_queue)
        return self
