"""run --ray's dispatcher without Ray: which worker gets which line, crashes, poison, cancel."""
from __future__ import annotations

from llamabatch.cluster.dispatch import GONE, Dispatcher, Line, WorkerState
from llamabatch.cluster.plan import WorkerTally
from llamabatch.results import Result, Timings, Usage


def ok(text: str = "x", tokens: int = 3) -> Result:
    return Result(0, text, [], "stop", Usage(5, 0, tokens), Timings())


class Cluster:
    """Workers that only record what they were sent; the test decides what happens next."""

    def __init__(self, n: int, cap: int = 2):
        self.workers = [WorkerState(WorkerTally(f"w{i + 1}", f"10.0.0.{i + 1}", 100 + i, 1), cap, 1)
                        for i in range(n)]
        self.sent: list[tuple[int, str]] = []
        self.cancels: list[int] = []
        self.d = Dispatcher(self.workers, self._send, lambda line: self.cancels.append(line.key))
        self.lines: dict[int, Line] = {}

    def _send(self, line: Line, worker: WorkerState) -> None:
        self.sent.append((line.key, worker.tally.name))

    def submit(self, *keys: int) -> list:
        out = []
        for k in keys:
            self.lines[k] = Line(k, f"prompt {k}", None)
            out += self.d.submit(self.lines[k])
        return out

    def on(self, name: str) -> list[int]:
        return sorted(self.w(name).inflight)

    def w(self, name: str) -> WorkerState:
        return next(w for w in self.workers if w.tally.name == name)

    def answer(self, key: int) -> list:
        return self.d.answered(self.lines[key], ok(f"t{key}"))


def test_lines_go_to_the_least_loaded_worker_up_to_its_cap():
    c = Cluster(2, cap=2)
    assert c.submit(0, 1, 2, 3, 4, 5) == []
    assert c.on("w1") == [0, 2] and c.on("w2") == [1, 3]
    assert c.d.waiting == 2  # backpressure: the rest wait on the driver
    out = c.answer(1)
    assert [(line.key, r.text) for line, r in out] == [(1, "t1")]
    assert c.on("w2") == [3, 4]
    assert c.w("w2").tally.lines == 1 and c.w("w2").tally.generated == 3


def test_a_dead_workers_lines_are_retried_in_quarantine_and_nothing_is_answered_twice():
    c = Cluster(2, cap=4)
    c.submit(*range(8))
    assert c.on("w1") == [0, 2, 4, 6]
    assert c.d.died(c.w("w1"), "ActorDiedError: killed") == []  # no answer for the lost lines yet
    assert c.d.retries == 4 and c.w("w1").tally.restarts == 1
    # a late answer from the dead worker is ignored: the line runs again elsewhere
    assert c.answer(0) == []
    c.d.back(c.w("w1"), 200)
    # w1 is idle: it takes one suspect group (ceil(sqrt(4)) = 2 lines) and nothing else
    assert c.on("w1") == [0, 2] and c.w("w1").quarantine == {0, 2}
    c.submit(8)
    assert 8 not in c.on("w1")
    answered = []
    for key in (0, 2):
        answered += c.answer(key)
    assert [line.key for line, _ in answered] == [0, 2]
    assert c.on("w1") == [4, 6]  # the next group
    for key in (4, 6):
        c.answer(key)
    assert c.w("w1").quarantine == set() and c.w("w1").tally.retried_here == 4


def test_a_poison_line_gets_an_error_and_the_innocent_finish():
    c = Cluster(1, cap=4)
    w1 = c.w("w1")
    c.submit(0, 1, 2, 3)
    c.d.died(w1, "killed")  # 1st crash: 0..3 are suspects
    c.d.back(w1, 201)
    assert c.on("w1") == [0, 1]  # group of 2
    c.answer(0)
    c.answer(1)
    assert c.on("w1") == [2, 3]
    c.d.died(w1, "killed")  # 2nd crash, 2 and 3 together: neither is blamed yet
    c.d.back(w1, 202)
    assert c.on("w1") == [2]  # alone now
    c.answer(2)
    assert c.on("w1") == [3]
    out = c.d.died(w1, "SIGABRT")  # alone, 2nd crash: poison
    assert [(line.key, r.finish_reason, r.error_code) for line, r in out] == [(3, "error", "engine_crashed")]
    assert "nothing else on it" in out[0][1].error and c.d.isolated == [3]
    c.d.back(w1, 203)
    c.submit(4)
    assert c.on("w1") == [4]  # fresh work flows again


def test_every_worker_gone_stops_with_no_answer_for_the_rest():
    c = Cluster(2, cap=1)
    c.submit(0, 1, 2)
    c.d.died(c.w("w1"), "node lost")
    assert c.d.gone(c.w("w1"), "node lost") == []
    assert c.d.fatal_error is None
    c.d.died(c.w("w2"), "node lost")
    out = c.d.gone(c.w("w2"), "ActorDiedError: node lost")
    assert sorted(line.key for line, _ in out) == [0, 1, 2]
    assert all(r.finish_reason == "cancelled" for _, r in out)
    assert c.d.fatal_error.startswith("every Ray worker is gone (2 of 2; last: w2 on 10.0.0.2")
    assert all(w.state == GONE for w in c.workers)
    late = c.submit(3)
    assert [(line.key, r.finish_reason) for line, r in late] == [(3, "cancelled")]


def test_cancel_waiting_and_running_lines():
    c = Cluster(1, cap=1)
    c.submit(0, 1)
    out = c.d.cancel(1)  # still on the driver: cancelled at once
    assert [(line.key, r.finish_reason) for line, r in out] == [(1, "cancelled")]
    assert c.d.cancel(0) == [] and c.cancels == [0]  # running: the worker is asked
    out = c.d.died(c.w("w1"), "killed")  # it dies before answering: no retry for a cancelled line
    assert [(line.key, r.finish_reason) for line, r in out] == [(0, "cancelled")]
    assert c.d.retries == 0


def test_an_urgent_line_goes_first_past_a_full_workers_cap_to_the_shortest_queue():
    """serve --ray's online requests (a lower priority number than batch lines) pass the waiting
    batch lines and may take a worker past its cap by its slots, on the least loaded worker."""
    c = Cluster(2, cap=2)
    c.submit(0, 1, 2, 3, 4, 5)  # both workers full, 4 and 5 wait
    c.answer(2)  # w1 takes 4: w1 [0, 4], w2 [1, 3]; 5 waits
    c.answer(1)
    assert c.on("w2") == [3, 5]
    for key in (6, 8):
        c.lines[key] = Line(key, "online", None, priority=-1)
        assert c.d.submit(c.lines[key]) == []
    assert c.d.waiting == 0 and c.on("w1") == [0, 4, 6] and c.on("w2") == [3, 5, 8]  # past the caps, one each
    c.lines[7] = Line(7, "batch", None)
    c.lines[9] = Line(9, "online", None, priority=-1)
    c.d.submit(c.lines[7])
    c.d.submit(c.lines[9])  # both workers past their caps by their slots: 9 and 7 wait
    assert c.d.waiting == 2
    c.answer(0)  # room for an urgent line on w1, not for a batch line: 9 passes 7
    assert c.on("w1") == [4, 6, 9] and c.d.waiting == 1


def test_a_lost_session_puts_every_line_back_as_not_run_and_none_goes_out_until_it_is_back():
    c = Cluster(2, cap=2)
    c.submit(*range(6))
    assert c.on("w1") == [0, 2] and c.on("w2") == [1, 3] and c.d.waiting == 2
    c.d.cancel(3)  # its cancel asked, its worker not told yet
    out = c.d.disconnected()
    assert [(line.key, r.finish_reason) for line, r in out] == [(3, "cancelled")]
    assert c.d.waiting == 5 and c.d.rerun == 3 and c.d.retries == 0  # not run: no retry, no crash suspect
    assert all(w.state == "disconnected" and not w.inflight for w in c.workers)
    sent = len(c.sent)
    assert c.submit(6) == [] and len(c.sent) == sent  # lines wait while it is away
    assert c.d.reconnected() == []
    assert c.on("w1") == [0, 2] and c.on("w2") == [1, 4] and c.d.waiting == 2  # the oldest first, as before
    assert c.d.fatal_error is None and c.d.isolated == [] and c.d.pauses == 1
