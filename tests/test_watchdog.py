"""The supervised engine's watchdog bookkeeping (llamabatch/supervised/watchdog.py), on a fake clock."""
from __future__ import annotations

import pytest

from llamabatch.supervised.watchdog import LOAD_FLOOR_S, LOAD_MARGIN, Watchdog, load_bound


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(floor=5.0, margin=10.0, busy=1):
    clock, fired, state = Clock(), [], {"busy": busy}
    dog = Watchdog(floor, margin, busy=lambda: state["busy"], on_hang=fired.append, clock=clock)
    return dog, clock, fired, state


def test_no_progress_for_the_floor_with_work_in_flight_fires_once_per_stall():
    dog, clock, fired, _ = make(floor=5.0)
    clock.now += 4.9
    dog.check()
    assert fired == []
    clock.now += 0.2
    dog.check()
    dog.check()  # the same stall: one kill, not one per look
    assert len(fired) == 1 and "no progress for 5.1s with 1 request(s) in flight" in fired[0]
    dog.progress()  # a new child made progress: the next stall fires again
    clock.now += 5.0
    dog.check()
    assert len(fired) == 2


def test_the_bound_grows_with_the_longest_recent_tick():
    dog, clock, fired, _ = make(floor=5.0, margin=10.0)
    dog.progress([0.02, 1.5, 0.03])  # one slow tick of 1.5 s: bound 15 s
    assert dog.bound() == pytest.approx(15.0)
    clock.now += 14.0
    dog.check()
    assert fired == []
    clock.now += 1.5
    dog.check()
    assert len(fired) == 1 and "bound 15.0s" in fired[0]


def test_only_recent_ticks_count():
    dog, _, _, _ = make(floor=1.0, margin=10.0)
    dog.progress([3.0])
    dog.progress([0.01] * 64)  # the slow one has left the window
    assert dog.bound() == pytest.approx(1.0)


def test_nothing_in_flight_is_never_a_hang():
    dog, clock, fired, state = make(floor=5.0, busy=0)
    clock.now += 3600
    dog.check()
    assert fired == []
    state["busy"] = 2  # work arrives: the caller restarts the clock when it sends it
    dog.progress()
    clock.now += 4.0
    dog.check()
    assert fired == []


def test_floor_zero_turns_it_off():
    dog, clock, fired, _ = make(floor=0.0)
    assert not dog.enabled
    clock.now += 3600
    dog.check()
    assert fired == []


def test_margin_below_one_is_refused():
    with pytest.raises(ValueError):
        Watchdog(5.0, 0.5, busy=lambda: 0, on_hang=lambda _r: None)


def test_a_restart_may_load_for_a_multiple_of_the_first_load():
    assert load_bound(1.0, 60.0) == LOAD_FLOOR_S  # a quick first load: the floor
    assert load_bound(100.0, 60.0) == pytest.approx(LOAD_MARGIN * 100.0)
    assert load_bound(1.0, 500.0) == 500.0  # never below the watchdog's own floor
