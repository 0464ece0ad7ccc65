"""The dry run's arithmetic, apart from any file or model: streaming prompt-length stats,
the prefix-reuse estimate, the ETA from the `auto` calibration, and with n_ctx auto the
most one request may hold and why a line can never fit.

Everything here is constant memory in the number of lines: lengths are counted in a
histogram (distinct lengths, not lines), prefix reuse looks only at the last few prompts.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Sequence

from ...config import DEFAULT_CTX_PER_SLOT, EngineConfig
from ...core.overflow_words import PAST_TRAINING_HELPS, past_training
from ...llama import autoslots
from ...settings.context_sizing import GRAIN, request_limit

RECENT = 8  # prompts a new one is compared with for prefix reuse (about what the slots hold)


class LengthStats:
    """Total, max and exact percentiles of prompt lengths, from a histogram."""

    def __init__(self) -> None:
        self.hist: Counter = Counter()
        self.count = 0
        self.total = 0

    def add(self, n: int) -> None:
        self.hist[n] += 1
        self.count += 1
        self.total += n

    def percentile(self, p: float) -> int | None:
        if not self.count:
            return None
        rank = max(1, -(-int(p * self.count * 100) // 10000))  # ceil(p% of count), nearest-rank
        seen = 0
        for n in sorted(self.hist):
            seen += self.hist[n]
            if seen >= rank:
                return n
        return max(self.hist)

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "max": max(self.hist) if self.hist else None,
                "p50": self.percentile(50), "p95": self.percentile(95)}


class PrefixReuse:
    """Tokens the prompt cache would not evaluate again: each prompt's longest common prefix
    with one of the last `recent` prompts (the slots keep their last prompt's KV; prefix
    sharing copies it between slots). An estimate: which slot gets which line is decided at
    run time."""

    def __init__(self, recent: int = RECENT, enabled: bool = True):
        self.enabled = enabled
        self._recent: deque = deque(maxlen=max(1, recent))
        self.tokens = 0

    def add(self, tokens: Sequence[int]) -> int:
        """Count `tokens` in; the tokens it adds to the estimate."""
        if not self.enabled:
            return 0
        best = 0
        for other in self._recent:
            n = 0
            for a, b in zip(tokens, other):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        gain = min(best, max(0, len(tokens) - 1))  # the last prompt token is always evaluated
        self.tokens += gain
        self._recent.append(list(tokens))
        return gain


@dataclass
class Eta:
    low_s: float | None
    high_s: float | None
    basis: str
    slots: int | None
    decode_tok_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"low_s": self.low_s, "high_s": self.high_s, "basis": self.basis, "slots": self.slots,
                "decode_tok_s": self.decode_tok_s}


def slot_ctx(config: EngineConfig, slots: int | None) -> int | None:
    if slots is None:
        return None if config.n_ctx else DEFAULT_CTX_PER_SLOT
    return config.n_ctx // slots if config.n_ctx else DEFAULT_CTX_PER_SLOT


def request_room(config: EngineConfig, slots: int | None, trained: int | None) -> int | None:
    """The most one request may hold, as the runner decides it (llama/runner.py): a slot's
    share, or with kv_unified up to the model's trained context within the pool the slots
    share (None: not known before the slots are)."""
    ctx = slot_ctx(config, slots)
    if ctx is None or not config.kv_unified or slots is None:
        return ctx
    return min(config.n_ctx or DEFAULT_CTX_PER_SLOT * slots, max(ctx, trained or 0))


@dataclass(frozen=True)
class AutoBounds:
    """n_ctx auto's bounds on one request, as settings/context_sizing.plan_context derives them
    from the model's facts: the model's trained context (at least 4,096), and the cells the KV
    memory allowed holds (None: not judged)."""
    model_ctx: int | None
    limit: int
    most_cells: int | None
    budget_text: str

    @classmethod
    def of(cls, model_ctx: int | None, per_token: int | None, budget: int | None, budget_text: str) -> "AutoBounds":
        most = budget // per_token if per_token and budget else None
        return cls(model_ctx, request_limit(model_ctx),
                   max(GRAIN, most // GRAIN * GRAIN) if most is not None else None, budget_text)

    @property
    def can_fit(self) -> int:
        """The most any one line may need (prompt + max_tokens) to be planned for."""
        return min(self.limit, self.most_cells) if self.most_cells is not None else self.limit

    def never_fits(self, prompt: int, max_tokens: int, room: int) -> str:
        """Why a prompt of `prompt` tokens cannot run where one request may hold `room`
        tokens under n_ctx auto, with the numbers, and what would help."""
        beyond = past_training(prompt, self.model_ctx)  # the engine's own words for it in a run
        if beyond:
            return beyond
        said = f"prompt has {prompt:,} tokens but one request may hold {room:,} under n_ctx auto"
        if prompt >= self.limit:  # the model's context unknown: a default slot is the most planned
            return (f"{said}{'' if room >= self.limit else f', and never more than {self.limit:,}'} (as a slot "
                    f"held before auto; the model's trained context is unknown): {PAST_TRAINING_HELPS}")
        if self.most_cells is not None and prompt >= self.most_cells:
            return (f"{said} ({self.budget_text} holds {self.most_cells:,} tokens of KV cache): more memory "
                    "(--max-memory) or a smaller KV cache (--cache-type-k/--cache-type-v q8_0)")
        if prompt + max_tokens > self.can_fit:
            return (f"{said}: with max_tokens {max_tokens:,} it needs {prompt + max_tokens:,}, more than the "
                    f"{self.can_fit:,} one request may ever hold, so the context was not sized for it; "
                    f"max_tokens {self.can_fit - prompt:,} or less would be")
        return f"{said}: no room is left to generate (--n-ctx gives more)"


def eta(slots: int | None, measured: dict[int, float], at: Any, output_tokens: int,
        prompt_tokens_to_evaluate: int) -> Eta:
    """A range, with its basis. Both ends assume every line generates all its max_tokens (an
    upper bound on generation); low counts prefill as free, high as slow as decoding."""
    if slots is None or not measured:
        return Eta(None, None, "no calibration on this machine for this model and thread count (run once with "
                   "--n-parallel auto to measure it); no ETA is given", slots, None)
    rate = measured.get(slots)
    if not rate:
        known = ", ".join(f"{n}" for n in sorted(measured))
        return Eta(None, None, f"the calibration measured {known} slots, not {slots}; no ETA is given", slots, None)
    low = output_tokens / rate
    high = (output_tokens + prompt_tokens_to_evaluate) / rate
    from datetime import datetime, timezone

    when = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d") if isinstance(at, (int, float)) else "?"
    basis = (f"estimate: {rate:.1f} decode tok/s at {slots} slots (the auto calibration on {autoslots.machine_key()}, "
             f"{when}, measured with 64-token contexts: longer ones decode slower); every line generating its "
             "max_tokens; prefill counted from free (low) to as slow as decoding (high)")
    return Eta(round(low, 1), round(high, 1), basis, slots, round(rate, 2))
