"""The supervised engine when its child hangs, crashes on everything, or loses its parent.

The child runs the scripted fake runner (tests/supervised_child_runner.py) and the model is a
file that only starts like a GGUF, so these run in the fast suite. Time bounds are set small
(watchdog 1-2 s; off where the test is about crashes, so a loaded machine cannot add a kill)
so each test takes a few seconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from llamabatch import EngineConfig, SamplingParams
from llamabatch.errors import EngineClosed
from llamabatch.supervised import ENGINE_CRASHED, ENGINE_UNAVAILABLE, SupervisedEngine
from llamabatch.supervised.child import CRASH_PROMPT_ENV
from llamabatch.supervised.engine import MAX_FRUITLESS_CRASHES

from child_tools import child_env, engine_children, fake_gguf, is_gone, wait_for_engine_child, wait_gone
from supervised_child_runner import HANG, choice

LONG = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)  # ~1 s per line with the "slow" runner
DOOMED = "this prompt makes the child abort"


@pytest.fixture
def config(tmp_path) -> EngineConfig:
    return EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, n_ctx=256, threads=1)


def test_a_stopped_child_is_killed_by_the_watchdog_and_every_request_finishes(config):
    with SupervisedEngine(config, default_params=LONG, env=child_env(), runner=choice("slow"),
                          watchdog_s=2.0) as engine:
        prompts = [f"line {i}" for i in range(6)]
        handles = [engine.submit(p, stream=False) for p in prompts]
        first = wait_for_engine_child(os.getpid())
        time.sleep(0.5)  # mid-generation
        os.kill(first, signal.SIGSTOP)
        stopped_at = time.monotonic()
        results = [h.result(timeout=60) for h in handles]
        took = time.monotonic() - stopped_at
    assert [r.text for r in results] == [(p + "!").ljust(20, "~") for p in prompts]  # each once, whole
    assert all(r.finish_reason == "length" and r.error is None for r in results)
    assert engine.hangs == 1 and engine.restarts == 1 and engine.isolated == []
    assert wait_gone(first, 5)
    assert took < 30  # the watchdog fired within its 2 s bound plus a restart, not never


def test_a_request_that_hangs_the_child_is_isolated_and_the_others_finish(config):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    with SupervisedEngine(config, default_params=params, env=child_env(), runner=choice("hangs_on_prompt"),
                          watchdog_s=1.0) as engine:
        prompts = [f"line {i}" for i in range(5)]
        prompts.insert(2, HANG)
        results = [h.result(timeout=120) for h in [engine.submit(p) for p in prompts]]
        hung = results[2]
        assert hung.error_code == ENGINE_CRASHED and "killed by the watchdog" in hung.error
        others = results[:2] + results[3:]
        assert [r.text for r in others] == [(p + "!").ljust(6, "~")[:6] for p in prompts[:2] + prompts[3:]]
        assert engine.isolated == [2] and engine.hangs >= 2 and engine.fatal_error is None
        assert engine.generate(["after"])[0].ok  # the engine goes on serving


def test_a_child_that_crashes_whatever_it_runs_is_an_engine_error_not_the_lines(config):
    with SupervisedEngine(config, env=child_env(), runner=choice("always_aborts"), watchdog_s=0) as engine:
        results = [h.result(timeout=120) for h in [engine.submit(f"line {i}") for i in range(10)]]
        assert {r.error_code for r in results} == {ENGINE_UNAVAILABLE}  # none blamed as engine_crashed
        assert engine.isolated == []
        fatal = engine.fatal_error
        assert fatal is not None and "crashes whatever it runs" in fatal and "threads=1" in fatal
        assert "the input lines are not the cause" in fatal and "\n" not in fatal
        assert engine.restarts == 1  # the crash, then the canary's: found after two, not eight
        with pytest.raises(EngineClosed):
            engine.submit("one more")


def test_a_poison_line_run_first_is_still_the_lines_fault(config):
    """The canary clears the engine: the line that crashed every child it ran in is the one blamed."""
    params = SamplingParams(max_tokens=4, temperature=0)
    env = child_env(**{CRASH_PROMPT_ENV: DOOMED})
    with SupervisedEngine(config, default_params=params, env=env, runner=choice(), watchdog_s=0) as engine:
        bad = engine.submit(DOOMED).result(timeout=120)
        assert bad.error_code == ENGINE_CRASHED and engine.fatal_error is None
        assert engine.generate(["fine"])[0].text == "fine"


def test_close_with_a_stopped_child_is_bounded_and_ends_every_request(config):
    engine = SupervisedEngine(config, default_params=LONG, env=child_env(), runner=choice("slow"), watchdog_s=0)
    handles = [engine.submit(f"line {i}", stream=False) for i in range(4)]
    child = wait_for_engine_child(os.getpid())
    time.sleep(0.3)
    os.kill(child, signal.SIGSTOP)
    started = time.monotonic()
    engine.close(timeout=1.0)
    assert time.monotonic() - started < 10
    assert [h.result(timeout=5).finish_reason for h in handles] == ["cancelled"] * 4
    assert wait_gone(child, 5)


PARENT = textwrap.dedent("""
    import sys, time
    from llamabatch import EngineConfig, SamplingParams
    from llamabatch.supervised import SupervisedEngine
    from supervised_child_runner import choice
    engine = SupervisedEngine(EngineConfig(model=sys.argv[1], n_parallel=2, n_ctx=256, threads=1), watchdog_s=0,
                              runner=choice("slow"))
    handle = engine.submit("a long one", SamplingParams(max_tokens=100000, ignore_eos=True))
    next(iter(handle))  # generating
    print("generating", flush=True)
    time.sleep(3600)
""")


@pytest.mark.parametrize("child_state", ["running", "stopped"])
def test_kill_9_of_the_parent_leaves_no_child(tmp_path, child_state):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, fake_gguf(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env=child_env(), cwd=os.path.dirname(__file__))
    try:
        assert parent.stdout.readline().strip() == "generating"
        child = engine_children(parent.pid)[0]
        if child_state == "stopped":  # it reads no stdin, so only the parent-death signal can end it
            os.kill(child, signal.SIGSTOP)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_gone(child, 5), f"engine child {child} outlived its parent ({child_state})"
    finally:
        if parent.poll() is None:
            parent.kill()
    assert is_gone(child)


def test_crashes_in_a_row_after_steps_ran_stop_the_engine(config):
    """Steps finish, so the canary is not the judge; crashes with no request finishing still stop it."""
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    with SupervisedEngine(config, default_params=params, env=child_env(), runner=choice("aborts_after_two_steps"),
                          watchdog_s=0) as engine:
        results = [h.result(timeout=120) for h in [engine.submit(f"line {i}") for i in range(10)]]
        assert ENGINE_UNAVAILABLE in {r.error_code for r in results}
        assert f"{MAX_FRUITLESS_CRASHES} times in a row" in engine.fatal_error
