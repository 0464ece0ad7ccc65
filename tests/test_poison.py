"""The poison-line rule, driven by a simulated worker that dies whenever a poison key is in it."""
from __future__ import annotations

import pytest

from llamabatch.core.poison import PoisonRule


def supervise(keys: list[int], poison: set[int], worker_size: int, rule: PoisonRule | None = None):
    """A single-worker supervisor as llamabatch.supervised runs one: fresh work in batches of
    `worker_size`; after a crash, quarantine groups alone. Returns (finished, poisoned, crashes)."""
    rule = rule or PoisonRule()
    fresh = list(keys)
    finished: list[int] = []
    poisoned: list[int] = []
    crashes = 0
    while fresh or rule.quarantining:
        if rule.quarantining:
            batch = rule.next_group()
            assert batch, "quarantining with nothing to hand out"
        else:
            batch, fresh = fresh[:worker_size], fresh[worker_size:]
        if poison & set(batch):
            crashes += 1
            verdict = rule.crashed(batch)
            poisoned += verdict.poisoned
            assert sorted(verdict.poisoned + verdict.retry) == sorted(batch)
        else:
            for key in batch:
                rule.finished(key)
                finished.append(key)
        assert crashes < 50, "no progress"
    return finished, poisoned, crashes


@pytest.mark.parametrize("n,worker_size", [(1, 1), (2, 2), (8, 8), (16, 16), (40, 16), (64, 64)])
def test_one_poison_line_is_found_and_every_other_line_finishes(n, worker_size):
    for bad in {0, n // 2, n - 1}:
        finished, poisoned, crashes = supervise(list(range(n)), {bad}, worker_size)
        assert poisoned == [bad]
        assert sorted(finished) == [k for k in range(n) if k != bad]  # each exactly once
        assert crashes <= 3


def test_poison_alone_from_the_start_takes_exactly_two_crashes():
    finished, poisoned, crashes = supervise([7], {7}, 1)
    assert (finished, poisoned, crashes) == ([], [7], 2)


def test_two_poison_lines_in_one_batch_are_both_found():
    finished, poisoned, crashes = supervise(list(range(20)), {3, 11}, 20)
    assert sorted(poisoned) == [3, 11]
    assert sorted(finished) == [k for k in range(20) if k not in (3, 11)]


def test_an_innocent_that_shared_two_crashes_is_retried_alone_not_blamed():
    rule = PoisonRule()
    rule.crashed(["a", "b"])  # first crash: both implicated
    group = rule.next_group()
    assert sorted(group) == ["a", "b"]  # two light suspects: one group of ceil(sqrt(2)) = 2
    verdict = rule.crashed(group)  # crashes again with both in it
    assert verdict.poisoned == [] and rule.crashes("a") == 2 and rule.crashes("b") == 2
    assert rule.next_group() == ["a"]  # each now runs alone
    rule.finished("a")  # a was innocent
    assert rule.crashes("a") == 0
    assert rule.next_group() == ["b"]
    assert rule.crashed(["b"]).poisoned == ["b"]
    assert rule.isolated == ["b"] and not rule.quarantining and rule.crash_total == 3


def test_groups_are_about_sqrt_of_the_suspects_and_capped():
    rule = PoisonRule(max_group=8)
    rule.crashed(range(16))
    sizes = []
    while rule.groups_waiting:
        sizes.append(len(rule.next_group()))
    assert sizes == [4, 4, 4, 4]
    rule = PoisonRule(max_group=3)
    rule.crashed(range(16))
    assert len(rule.next_group()) == 3


def test_a_cancelled_suspect_leaves_its_waiting_group():
    rule = PoisonRule()
    rule.crashed(["a", "b", "c", "d", "e"])  # groups of 3: [a b c] [d e]
    rule.finished("d")
    rule.finished("e")
    assert rule.groups_waiting == 1
    assert rule.next_group() == ["a", "b", "c"]
    for key in "abc":
        rule.finished(key)
    assert not rule.quarantining


def test_a_crash_with_nothing_in_flight_blames_nobody():
    rule = PoisonRule()
    verdict = rule.crashed([])
    assert verdict.poisoned == [] and verdict.retry == [] and not rule.quarantining and rule.crash_total == 1
