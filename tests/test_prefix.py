"""Prefix-cache slot choice: longest match wins, ties go to the least recently used slot."""
from __future__ import annotations

import random

import pytest

from llamabatch.core.prefixes.prefix import SlotView, choose_slot, common_prefix_len


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([], [], 0),
        ([], [1, 2], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5], [6], 0),
    ],
)
def test_common_prefix_len_small_cases(a, b, expected):
    assert common_prefix_len(a, b) == expected


def test_common_prefix_len_mixes_lists_and_tuples():
    assert common_prefix_len([1, 2, 3, 4], (1, 2, 7)) == 2
    assert common_prefix_len((1, 2, 3), range(1, 10)) == 3


@pytest.mark.parametrize("split", [0, 1, 255, 256, 257, 1000, 4095])
def test_common_prefix_len_long_lists_at_chunk_edges(split):
    rng = random.Random(split)
    a = [rng.randrange(262_144) for _ in range(4096)]
    b = list(a)
    b[split] = -1
    assert common_prefix_len(a, b) == split
    assert common_prefix_len(a, a[:split]) == split


def test_common_prefix_len_matches_naive_loop():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(0, 1200)
        a = [rng.randrange(4) for _ in range(n)]
        b = a[: rng.randint(0, n)] + [rng.randrange(4) for _ in range(rng.randint(0, 600))]
        naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix_len(a, b) == naive


def slot(slot_id, cached, last_used):
    return SlotView(slot_id=slot_id, cached=cached, last_used=last_used)


def test_longest_match_wins_over_recency():
    prompt = [1, 2, 3, 4, 5, 6]
    slots = [
        slot(0, [1, 2], last_used=1.0),
        slot(1, [1, 2, 3, 4, 9], last_used=5.0),  # most recently used, but longest match
        slot(2, [7, 7, 7], last_used=0.5),
    ]
    assert choose_slot(prompt, slots) == (1, 4)


def test_tie_goes_to_least_recently_used():
    prompt = [1, 2, 3, 4]
    slots = [
        slot(0, [1, 2, 8], last_used=3.0),
        slot(1, [1, 2, 9], last_used=1.0),
        slot(2, [1, 2, 7], last_used=2.0),
    ]
    assert choose_slot(prompt, slots) == (1, 2)


def test_no_match_anywhere_picks_least_recently_used():
    slots = [slot(0, [9], 2.0), slot(1, [8], 0.1), slot(2, [], 1.0)]
    assert choose_slot([1, 2, 3], slots) == (1, 0)


def test_equal_last_used_breaks_tie_on_slot_id():
    slots = [slot(3, [], 1.0), slot(1, [], 1.0), slot(2, [], 1.0)]
    assert choose_slot([1, 2], slots) == (1, 0)


def test_full_match_is_capped_so_one_token_is_evaluated():
    prompt = [1, 2, 3, 4]
    assert choose_slot(prompt, [slot(0, [1, 2, 3, 4], 0.0)]) == (0, 3)
    # A cache longer than the prompt (an earlier, longer conversation) is capped too.
    assert choose_slot(prompt, [slot(0, [1, 2, 3, 4, 5, 6], 0.0)]) == (0, 3)


def test_full_match_and_one_short_tie_then_lru_decides():
    # Both save the same work (3 tokens after the cap), so recency decides.
    prompt = [1, 2, 3, 4]
    slots = [slot(0, [1, 2, 3, 4], last_used=2.0), slot(1, [1, 2, 3], last_used=1.0)]
    assert choose_slot(prompt, slots) == (1, 3)


def test_single_token_prompt_reuses_nothing():
    assert choose_slot([42], [slot(0, [42], 0.0)]) == (0, 0)


def test_empty_caches_everywhere():
    slots = [slot(0, [], 5.0), slot(1, [], 4.0)]
    assert choose_slot([1, 2, 3], slots) == (1, 0)


def test_cache_prompt_false_is_plain_lru_with_no_reuse():
    prompt = [1, 2, 3, 4]
    slots = [slot(0, [1, 2, 3, 4], last_used=9.0), slot(1, [], last_used=1.0)]
    assert choose_slot(prompt, slots, cache_prompt=False) == (1, 0)
    assert choose_slot(prompt, slots, cache_prompt=True) == (0, 3)


def test_no_idle_slots_is_an_error():
    with pytest.raises(ValueError):
        choose_slot([1, 2], [])
