"""How the Ray pool's watcher hands a worker its lines and asks for answers, without Ray: lines
ride on the worker's next take() unless its engine has a free batch slot or one is urgent, and
a busy worker's take() holds its answers until its queue is used up (or at its first answer
with an urgent line on it)."""
from __future__ import annotations

from llamabatch.cluster.dispatch import Line, WorkerState
from llamabatch.cluster.plan import WorkerTally
from llamabatch.cluster.watcher import LINGER_S, hand_out_now, take_linger

ONLINE, BATCH = 0, 5  # priorities: below 5 is urgent (serve's online requests)


def worker_with(inflight: int, priority: int = BATCH, slots: int = 8, reserved: int = 0) -> WorkerState:
    w = WorkerState(WorkerTally("w1", "10.0.0.1", 100, 1), 2 * slots, slots, reserved=reserved)
    for key in range(inflight):
        w.inflight[key] = Line(key, "p", None, worker=w, priority=priority)
    return w


def test_lines_go_at_once_while_the_engine_has_a_free_batch_slot():
    w = worker_with(8)
    assert hand_out_now(w, [w.inflight[7]], BATCH)  # 7 there before it, 8 batch slots
    w = worker_with(9)
    assert not hand_out_now(w, [w.inflight[8]], BATCH)  # 8 there: the 9th waits for the take out
    assert hand_out_now(w, [w.inflight[7], w.inflight[8]], BATCH)  # 7 there: these two go
    reserved = worker_with(7, reserved=2)  # 2 of its 8 slots kept for online requests: 6 batch slots
    assert not hand_out_now(reserved, [reserved.inflight[6]], BATCH)


def test_an_urgent_line_goes_at_once_even_to_a_busy_worker():
    w = worker_with(16)
    w.inflight[16] = urgent = Line(16, "p", None, worker=w, priority=ONLINE)
    assert hand_out_now(w, [urgent], BATCH)
    assert not hand_out_now(w, [w.inflight[15]], BATCH)


def test_a_busy_workers_take_wants_its_whole_queue_and_an_urgent_line_its_first_answer():
    assert take_linger(worker_with(16), BATCH) == (8, LINGER_S)  # 8 queued beyond its 8 slots
    assert take_linger(worker_with(16, reserved=2), BATCH) == (10, LINGER_S)
    assert take_linger(worker_with(9), BATCH) == (1, 0.0)  # one queued: nothing to gather
    assert take_linger(worker_with(3), BATCH) == (1, 0.0)
    assert take_linger(worker_with(16, priority=ONLINE), BATCH) == (1, 0.0)
