"""The Ray worker's put/take/cancel in this process (no Ray: EngineWorker is a plain class that
ray.remote wraps), on the scripted fake runner: every line put comes back by take exactly once,
a refused one with its error, one cancelled before it arrived as cancelled; a take hands out the
lines it carries and holds its answers for as many as the driver wants, within its bound."""
from __future__ import annotations

import os
import time

import pytest

from llamabatch import EngineConfig, SamplingParams
from llamabatch.cluster.worker import EngineWorker
from supervised_child_runner import choice


@pytest.fixture
def worker():
    w = EngineWorker(EngineConfig(model="fake.gguf", n_parallel=2, n_ctx=512, prefix_store=None),
                     SamplingParams(max_tokens=3, temperature=0.0), runner=choice("fake"))
    info = w.start()
    assert info["n_parallel"] == 2 and info["pid"] == os.getpid()
    yield w
    w.close()


def take_all(worker, n: int) -> dict:
    got: dict = {}
    for _ in range(50):
        pid, taken = worker.take(1.0)
        assert pid == os.getpid()  # the driver tells a restarted process by its pid
        for key, result in taken:
            assert key not in got, f"line {key} answered twice"
            got[key] = result
        if len(got) == n:
            return got
    raise AssertionError(f"{len(got)} of {n} lines came back")


def test_lines_put_together_come_back_by_take_once_each(worker):
    worker.cancel(7)  # the cancel overtakes its line
    worker.put([(1, "hello", None), (7, "cancel me", None), (2, "x" * 2000, None),
                (3, "more", SamplingParams(max_tokens=1, temperature=0.0))])
    got = take_all(worker, 4)
    assert (got[1].finish_reason, got[1].text) == ("length", "hel")
    assert (got[3].finish_reason, got[3].usage.completion_tokens) == ("length", 1)  # its own params
    assert got[7].finish_reason == "cancelled"
    assert (got[2].finish_reason, got[2].error_code) == ("error", "context_overflow")  # refused: its own error
    assert worker.take(0.05) == (os.getpid(), [])  # nothing left, nothing twice


def test_a_cancel_reaches_a_running_line(worker):
    worker.put([(5, "a long one", SamplingParams(max_tokens=200, temperature=0.0))])
    worker.cancel(5)
    assert take_all(worker, 1)[5].finish_reason == "cancelled"


def test_a_node_with_another_llamabatch_version_is_refused_before_loading():
    w = EngineWorker(EngineConfig(model="fake.gguf", n_parallel=2, n_ctx=512, prefix_store=None),
                     SamplingParams(max_tokens=3), runner=choice("fake"))
    from llamabatch.version import __version__

    info = w.start("0.0.0-driver")
    assert info["error"] == (f"llamabatch {__version__} is installed there and 0.0.0-driver here: "
                             "install the same version on every node")
    assert w._engine is None  # nothing loaded
    assert "error" not in w.start(__version__)
    w.close()


def test_a_take_hands_its_lines_out_and_holds_its_answers_for_as_many_as_it_wants(worker):
    long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)  # 60 ticks of 5 ms: after the short ones
    pid, taken = worker.take(5.0, [(1, "a", None), (2, "b", None), (3, "c", long)], 1, 0.0)
    assert pid == os.getpid() and 1 <= len(taken) <= 2 and 3 not in dict(taken)  # at its first answers
    got = dict(taken)
    _, taken = worker.take(5.0, [(4, "d", None)], 3, 30.0)  # wants 3: the short ones and the long one
    got.update(taken)
    assert sorted(got) == [1, 2, 3, 4] and got[3].usage.completion_tokens == 60  # one call, every answer
    assert worker.take(0.05) == (os.getpid(), [])


def test_a_take_lingers_no_longer_than_its_bound_nor_once_nothing_runs(worker):
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)  # 1 s at 5 ms a tick
    started = time.monotonic()
    _, taken = worker.take(5.0, [(1, "a", None), (2, "b", long)], 2, 0.2)
    assert [key for key, _ in taken] == [1] and time.monotonic() - started < 0.9  # not the 1 s of line 2
    _, taken = worker.take(5.0, [], 5, 30.0)  # wants 5 of the one line left: answers when it ends
    assert [key for key, _ in taken] == [2] and time.monotonic() - started < 10


def test_an_urgent_lines_answer_is_not_held_for_others(worker):
    long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)  # 2 s at 5 ms a tick
    online = SamplingParams(max_tokens=3, temperature=0.0, priority=-1)  # above the default priority
    started = time.monotonic()
    _, taken = worker.take(5.0, [(1, "b", long), (2, "a", online)], 2, 30.0)  # wants 2, may linger 30 s
    assert [key for key, _ in taken] == [2] and time.monotonic() - started < 1.5  # at once, not with line 1
    worker.cancel(1)
    assert take_all(worker, 1)[1].finish_reason == "cancelled"
