"""What a request gives back: streamed Deltas and one final Result."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FINISH_REASONS = ("stop", "length", "cancelled", "error", "timeout")


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache, not evaluated
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_tokens": self.total_tokens}


@dataclass
class Timings:
    queue_ms: float = 0.0  # submitted -> given a slot
    ttft_ms: float = 0.0  # submitted -> first token sampled
    prompt_ms: float = 0.0  # given a slot -> first token sampled (prefill)
    decode_ms: float = 0.0  # first token -> last token
    prompt_tokens_per_s: float = 0.0  # evaluated (not cached) prompt tokens / prompt_ms
    generated_tokens_per_s: float = 0.0  # tokens after the first / decode_ms

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


@dataclass
class Delta:
    """A piece of streamed text. Deltas of one request join to exactly its Result.text."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    index: int = 0  # which sample of an n-request the text belongs to


@dataclass
class Result:
    request_id: int
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    seed: int | None = None
    error: str | None = None  # one-line message when finish_reason == "error"
    error_code: str | None = None
    stop: str | None = None  # the stop string that ended generation, if any
    logprobs: list[dict[str, Any]] | None = None
    index: int = 0  # which sample of an n-request this is
    samples: list["Result"] | None = None  # n > 1: one Result per sample, in index order
    deterministic: bool = False  # produced in deterministic mode (batch-invariant)

    @property
    def all_logprobs(self) -> Any:
        """What records carry under "logprobs": the token records, or for n > 1 one list per sample."""
        if self.samples is not None:
            return None if self.logprobs is None else [s.logprobs for s in self.samples]
        return self.logprobs

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        if self.samples is not None:  # n > 1: every sample's text and finish reason, in index order
            head: dict[str, Any] = {"texts": [s.text for s in self.samples],
                                    "finish_reasons": [s.finish_reason for s in self.samples]}
        else:
            head = {"text": self.text}
        out: dict[str, Any] = {
            **head,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "timings": self.timings.to_dict(),
            "seed": self.seed,
            "error": None if self.error is None else {"code": self.error_code, "message": self.error},
        }
        if self.deterministic:
            out["deterministic"] = True
        return out
