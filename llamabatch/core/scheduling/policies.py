"""Batch-building policies: who gets how many tokens of this tick's budget.

A policy is a pure function. It receives the sequences that want decode tokens
(generating: one, or with tokens a grammar forced, those too) and those with prompt left to
evaluate (prefilling, in admission order), the tick's token budget (n_batch) and the per-slot
chunk cap, and returns [(sequence, n_tokens)]. It never looks at llama.cpp, so it is tested
with plain lists.
"""
from __future__ import annotations

from typing import Callable, Sequence as Seq, TypeVar

from ...config import POLICY_NAMES

T = TypeVar("T")
Allocation = list[tuple[T, int]]
Policy = Callable[[Seq[T], Seq[T], int, int, Callable[[T], int]], Allocation]


def _fill_prefill(prefills: Seq[T], budget: int, chunk_size: int, remaining: Callable[[T], int]) -> Allocation:
    out: Allocation = []
    for seq in prefills:
        if budget <= 0:
            break
        n = min(remaining(seq), chunk_size, budget)
        if n > 0:
            out.append((seq, n))
            budget -= n
    return out


def _fill_decode(decodes: Seq[T], budget: int, chunk_size: int, remaining: Callable[[T], int]) -> Allocation:
    """Each generating sequence its pending tokens: its last sampled one, and any its grammar
    forced after it (llama/sampling/mask_grammar.py), as one chunk of at most chunk_size, while the
    budget lasts. Without forced tokens that is one token each, as it always was."""
    out: Allocation = []
    for seq in decodes:
        if budget <= 0:
            break
        n = max(1, min(remaining(seq), chunk_size, budget))
        out.append((seq, n))
        budget -= n
    return out


def decode_maximal(decodes: Seq[T], prefills: Seq[T], budget: int, chunk_size: int,
                   remaining: Callable[[T], int]) -> Allocation:
    """Every generating slot gets its token first (steady inter-token latency); prefill
    chunks fill what is left of the budget."""
    out = _fill_decode(decodes, budget, chunk_size, remaining)
    return out + _fill_prefill(prefills, budget - sum(n for _, n in out), chunk_size, remaining)


def prefill_priority(decodes: Seq[T], prefills: Seq[T], budget: int, chunk_size: int,
                     remaining: Callable[[T], int]) -> Allocation:
    """Prompts first (lowest time to first token); decode tokens take what is left, so a
    long prefill can pause generation for a tick."""
    out = _fill_prefill(prefills, budget, chunk_size, remaining)
    left = budget - sum(n for _, n in out)
    return out + _fill_decode(decodes, left, chunk_size, remaining)


def balanced(decodes: Seq[T], prefills: Seq[T], budget: int, chunk_size: int,
             remaining: Callable[[T], int]) -> Allocation:
    """Half the budget is reserved for prefill, the other half for decode; whatever one
    side leaves unused goes to the other."""
    prefill_share = budget // 2
    first = _fill_prefill(prefills, prefill_share, chunk_size, remaining)
    used = sum(n for _, n in first)
    dec = _fill_decode(decodes, budget - used, chunk_size, remaining)
    used += sum(n for _, n in dec)
    # second pass: prefill may take what decode did not need, continuing each sequence's chunk
    given = {id(s): n for s, n in first}
    more: Allocation = []
    left = budget - used
    for seq in prefills:
        if left <= 0:
            break
        have = given.get(id(seq), 0)
        extra = min(remaining(seq) - have, chunk_size - have, left)
        if extra > 0:
            more.append((seq, extra))
            left -= extra
    merged: dict[int, list] = {id(s): [s, n] for s, n in first}
    for s, n in more:
        merged.setdefault(id(s), [s, 0])[1] += n
    return [(s, n) for s, n in merged.values()] + dec


# Keyed by the names EngineConfig accepts (config.POLICY_NAMES), in that order.
POLICIES: dict[str, Policy] = dict(zip(POLICY_NAMES, (decode_maximal, prefill_priority, balanced)))
