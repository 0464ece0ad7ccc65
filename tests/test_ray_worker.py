"""The Ray worker's put/take/cancel in this process (no Ray: EngineWorker is a plain class that
ray.remote wraps), on the scripted fake runner: every line put comes back by take exactly once,
a refused one with its error, one cancelled before it arrived as cancelled."""
from __future__ import annotations

import os

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
