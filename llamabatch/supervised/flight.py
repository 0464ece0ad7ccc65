"""A request of the supervised engine without its terminal outcome, and what its caller has
been streamed: a request retried in a new child streams again from the start, and the caller
sees only the part it has not seen yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.handle import RequestHandle
from ..params import SamplingParams
from ..results import Delta


@dataclass
class Flight:
    """A request without its terminal outcome, and what its caller has already been streamed."""

    handle: RequestHandle
    prompt: Any
    params: SamplingParams
    submitted_at: float
    cancel_requested: bool = False
    sent_chars: int = 0  # streamed to the caller so far (over every attempt)
    sent_tokens: int = 0
    attempt_chars: int = 0  # produced by the current attempt
    attempt_tokens: int = 0
    sent_reasoning: int = 0  # a thinking answer's reasoning characters, counted as the text's are
    attempt_reasoning: int = 0
    crashes: list[str] = field(default_factory=list)  # how each child it was in died

    @property
    def pid(self) -> int:
        return self.handle.request_id

    def new_attempt(self) -> None:
        """A new child runs it again: its output streams again from the start."""
        self.attempt_chars = self.attempt_tokens = self.attempt_reasoning = 0

    def new_part(self, text: str, tokens: list[int], reasoning: str = "") -> Delta | None:
        """The part of a Delta the caller has not seen: a retry streams again from the start."""
        skip_chars = max(0, self.sent_chars - self.attempt_chars)
        skip_tokens = max(0, self.sent_tokens - self.attempt_tokens)
        skip_reasoning = max(0, self.sent_reasoning - self.attempt_reasoning)
        self.attempt_chars += len(text)
        self.attempt_tokens += len(tokens)
        self.attempt_reasoning += len(reasoning)
        self.sent_chars = max(self.sent_chars, self.attempt_chars)
        self.sent_tokens = max(self.sent_tokens, self.attempt_tokens)
        self.sent_reasoning = max(self.sent_reasoning, self.attempt_reasoning)
        text, tokens, reasoning = text[skip_chars:], tokens[skip_tokens:], reasoning[skip_reasoning:]
        return Delta(text, list(tokens), reasoning=reasoning) if text or tokens or reasoning else None
