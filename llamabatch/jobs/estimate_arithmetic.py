"""The dry run's arithmetic, apart from any file or model: streaming prompt-length stats,
the prefix-reuse estimate, and the ETA from the `auto` calibration.

Everything here is constant memory in the number of lines: lengths are counted in a
histogram (distinct lengths, not lines), prefix reuse looks only at the last few prompts.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Sequence

from ..config import DEFAULT_CTX_PER_SLOT, EngineConfig
from ..llama import autoslots

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

    def add(self, tokens: Sequence[int]) -> None:
        if not self.enabled:
            return
        best = 0
        for other in self._recent:
            n = 0
            for a, b in zip(tokens, other):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self.tokens += min(best, max(0, len(tokens) - 1))  # the last prompt token is always evaluated
        self._recent.append(list(tokens))


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
