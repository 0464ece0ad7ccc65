"""Batch-building policies: pure functions over plain lists, no model, no scheduler."""
from __future__ import annotations

import random

import pytest

from llamabatch.core.scheduling.policies import POLICIES, balanced, decode_maximal, prefill_priority


class Req:
    """A stand-in sequence: a name and how many tokens it still has to evaluate."""

    def __init__(self, name: str, pending: int = 1):
        self.name = name
        self.pending = pending

    def __repr__(self) -> str:
        return f"Req({self.name}, {self.pending})"


def remaining(r: Req) -> int:
    return r.pending


def names(allocation) -> list[tuple[str, int]]:
    return [(r.name, n) for r, n in allocation]


def decodes(n: int) -> list[Req]:
    return [Req(f"d{i}") for i in range(n)]


# -- decode-maximal ------------------------------------------------------------------------

def test_decode_maximal_gives_every_decode_a_token_then_prefills_in_fifo_order():
    prefills = [Req("p0", 300), Req("p1", 100), Req("p2", 50)]
    out = decode_maximal(decodes(3), prefills, 512, 256, remaining)
    assert names(out) == [("d0", 1), ("d1", 1), ("d2", 1), ("p0", 256), ("p1", 100), ("p2", 50)]


def test_decode_maximal_prefill_takes_only_what_decode_leaves():
    out = decode_maximal(decodes(8), [Req("p0", 1000), Req("p1", 1000)], 64, 256, remaining)
    assert names(out)[:8] == [(f"d{i}", 1) for i in range(8)]
    assert names(out)[8:] == [("p0", 56)]  # the budget ran out before p1: it waits, in order
    assert sum(n for _, n in out) == 64


def test_decode_maximal_with_no_prefill_room_schedules_decodes_only():
    out = decode_maximal(decodes(4), [Req("p0", 10)], 4, 256, remaining)
    assert names(out) == [(f"d{i}", 1) for i in range(4)]


def test_decode_maximal_skips_prefills_with_nothing_left():
    out = decode_maximal([], [Req("done", 0), Req("p1", 5)], 512, 256, remaining)
    assert names(out) == [("p1", 5)]


# -- prefill-priority ----------------------------------------------------------------------

def test_prefill_priority_puts_prompts_first_and_decodes_in_what_is_left():
    out = prefill_priority(decodes(4), [Req("p0", 200), Req("p1", 300)], 512, 256, remaining)
    assert names(out) == [("p0", 200), ("p1", 256), ("d0", 1), ("d1", 1), ("d2", 1), ("d3", 1)]


def test_prefill_priority_can_pause_decodes_for_a_tick():
    out = prefill_priority(decodes(4), [Req("p0", 300), Req("p1", 300)], 258, 256, remaining)
    assert names(out) == [("p0", 256), ("p1", 2)]  # no decode token this tick


# -- balanced ------------------------------------------------------------------------------

def test_balanced_reserves_half_for_prefill_and_half_for_decode():
    out = balanced(decodes(10), [Req("p0", 1000)], 16, 256, remaining)
    got = dict(names(out))
    assert got["p0"] == 8
    assert sum(1 for r, _ in out if r.name.startswith("d")) == 8
    assert sum(n for _, n in out) == 16


def test_balanced_gives_unused_decode_share_to_prefill_continuing_the_same_chunk():
    out = balanced(decodes(2), [Req("p0", 1000), Req("p1", 1000)], 100, 64, remaining)
    got = names(out)
    # p0's first-pass chunk (50 -> capped at 64) is topped up, not split into two entries
    assert [name for name, _ in got].count("p0") == 1
    assert dict(got)["p0"] == 64
    assert dict(got)["p1"] == 100 - 64 - 2
    assert [name for name, _ in got if name.startswith("d")] == ["d0", "d1"]


def test_balanced_gives_unused_prefill_share_to_decode():
    out = balanced(decodes(12), [], 16, 256, remaining)
    assert names(out) == [(f"d{i}", 1) for i in range(12)]


# -- properties every policy keeps ---------------------------------------------------------

@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_respects_budget_chunk_cap_and_remaining(name):
    policy = POLICIES[name]
    rng = random.Random(1234)
    for _ in range(500):
        n_dec = rng.randint(0, 16)
        budget = rng.randint(max(n_dec, 1), 600)  # n_batch >= n_parallel is enforced by EngineConfig
        chunk = rng.randint(1, 300)
        decs = decodes(n_dec)
        pres = [Req(f"p{i}", rng.randint(0, 700)) for i in range(rng.randint(0, 8))]
        out = policy(decs, pres, budget, chunk, remaining)
        total = sum(n for _, n in out)
        assert total <= budget, (name, budget, out)
        seen = [r.name for r, _ in out]
        assert len(seen) == len(set(seen)), f"{name}: a sequence appears twice: {seen}"
        for r, n in out:
            assert n >= 1
            if r.name.startswith("d"):
                assert n == 1
            else:
                assert n <= min(chunk, r.pending), (name, r, n, chunk)
        # prefills are served in FIFO order: whoever got tokens forms a prefix of the
        # queue once the empty ones are skipped, except where an earlier one was capped
        got_pre = [r for r, _ in out if r.name.startswith("p")]
        order = [r for r in pres if r.pending > 0]
        assert got_pre == order[: len(got_pre)], (name, got_pre, order)
        if name == "decode-maximal":
            # every decode token is scheduled (budget >= number of decodes)
            assert sum(1 for r in seen if r.startswith("d")) == n_dec


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_uses_the_whole_budget_when_there_is_work(name):
    policy = POLICIES[name]
    out = policy(decodes(4), [Req("p0", 10_000), Req("p1", 10_000), Req("p2", 10_000)], 512, 256, remaining)
    assert sum(n for _, n in out) == 512
    # and with a tiny budget
    out = policy(decodes(4), [Req("p0", 10_000)], 4, 256, remaining)
    assert sum(n for _, n in out) == 4


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_returns_nothing_without_work(name):
    assert POLICIES[name]([], [], 512, 256, remaining) == []
