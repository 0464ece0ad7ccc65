"""The data that crosses between scheduler and runner each tick, and the Runner protocol.

The scheduler produces a StepPlan; the runner turns it into one llama_decode and samples
the rows that asked for logits; the scheduler consumes the StepResult. The plan is the
whole contract: each chunk that wants logits carries the sampler chain to sample its row
with and how many logprobs to report, so `runner.execute(plan)` needs nothing else (no
per-slot sampler state on the side, no reaching back into the scheduler's sequences).
Plain dataclasses keep the scheduler testable with a scripted fake runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Chunk:
    """Tokens of one slot evaluated in this tick, at positions start_pos, start_pos+1, ..."""

    slot: int
    request_id: int
    tokens: list[int]
    start_pos: int
    wants_logits: bool  # True when the chunk reaches the end of what is known: sample after it
    is_decode: bool  # one generated token being fed back (as opposed to a prompt chunk)
    suppress_eog: bool = False  # min_tokens not reached: an end-of-generation token must be resampled
    sampler: Any = None  # the request's sampler chain (runner.build_sampler); samples the row when wants_logits
    logprobs: int | None = None  # report the sampled token's logprob and this many alternatives (None = no)


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def decode_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if c.is_decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if not c.is_decode)

    def __bool__(self) -> bool:
        return bool(self.chunks)


@dataclass
class StepResult:
    """What one llama_decode gave. status follows llama_decode: 0 ok, 1 no KV room, <0 fatal."""

    status: int = 0
    sampled: dict[int, int] = field(default_factory=dict)  # slot -> token sampled after its chunk
    logprobs: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> logprob record
    eval_ms: float = 0.0
    sample_ms: float = 0.0


class Runner(Protocol):
    """Everything that touches llama.cpp. `runner.LlamaRunner` is the real one."""

    n_slots: int
    slot_ctx: int

    def tokenize(self, text: str, *, special: bool) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def build_sampler(self, params: Any, seed: int) -> Any:
        """Build a sampler chain (raises InvalidRequest for e.g. a grammar that does not parse)."""

    def free_sampler(self, sampler: Any) -> None: ...

    def keep_prefix(self, slot: int, n_keep: int) -> int:
        """Drop the slot's KV cells at positions >= n_keep; return how many are really kept."""

    def execute(self, plan: StepPlan) -> StepResult:
        """One llama_decode of the plan; sample each wants_logits row with its chunk's sampler."""

    def close(self) -> None: ...

