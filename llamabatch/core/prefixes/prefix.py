"""Prefix-cache slot choice: which idle slot's KV cache can a new prompt reuse?

Pure functions over token lists; the runner applies the resulting trim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .common_prefix import common_prefix

@dataclass(frozen=True)
class SlotView:
    """What the slot chooser needs to know about one idle slot."""

    slot_id: int
    cached: Sequence[int]  # tokens whose KV entries the slot holds, in order
    last_used: float  # monotonic time the slot last finished a request


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share."""
    # Slice comparison is only meaningful between two lists (a list never equals a tuple, and
    # numpy slices compare element-wise), so normalise once.
    return common_prefix(a if type(a) is list else list(a), b if type(b) is list else list(b))


def choose_slot(
    prompt: Sequence[int],
    idle_slots: Sequence[SlotView],
    cache_prompt: bool = True,
) -> tuple[int, int]:
    """Return (slot_id, reusable_tokens) for a new prompt.

    Prefer the idle slot whose cached tokens share the longest prefix with `prompt`;
    ties, and the case where nothing matches, go to the least recently used slot
    (smallest `last_used`, then smallest `slot_id`). `reusable_tokens` is capped at
    `len(prompt) - 1`: the last prompt token is always evaluated because its logits
    are what the first sampled token comes from. With `cache_prompt=False` the choice
    is plain LRU and nothing is reused.
    """
    if not idle_slots:
        raise ValueError("choose_slot needs at least one idle slot")
    max_reusable = max(len(prompt) - 1, 0)

    def lru_key(slot: SlotView) -> tuple[float, int]:
        return (slot.last_used, slot.slot_id)

    if not cache_prompt:
        return min(idle_slots, key=lru_key).slot_id, 0

    if type(prompt) is not list:  # convert once, not once per slot
        prompt = list(prompt)
    best: SlotView | None = None
    best_reusable = -1
    for slot in idle_slots:
        # Compare capped values: a full match and a match one short of it save the same
        # work, so they tie and LRU decides.
        reusable = min(common_prefix_len(prompt, slot.cached), max_reusable)
        if (
            best is None
            or reusable > best_reusable
            or (reusable == best_reusable and lru_key(slot) < lru_key(best))
        ):
            best, best_reusable = slot, reusable
    assert best is not None
    return best.slot_id, best_reusable


def longest_shared(prompt: Sequence[int], candidates: Sequence[tuple[int, Sequence[int]]]) -> tuple[int | None, int]:
    """Return (slot_id, tokens) of the candidate whose tokens share the longest prefix with
    `prompt`, capped at `len(prompt) - 1` (the last prompt token is always evaluated);
    (None, 0) when none shares anything. Ties go to the first candidate."""
    if type(prompt) is not list:
        prompt = list(prompt)
    cap = max(len(prompt) - 1, 0)
    best_id, best = None, 0
    for slot_id, tokens in candidates:
        n = min(common_prefix_len(prompt, tokens), cap)
        if n > best:
            best_id, best = slot_id, n
    return best_id, best
