"""Runners for engines in other processes in unit tests: the supervised engine's child and Ray
workers run the one a test names with `choice(NAME)` (llamabatch/in_process/runners.py).

Importing this module registers every runner below under its function's name. The child and
the workers import it by name, so their sys.path must hold tests/ (child_tools.child_env puts
it in PYTHONPATH).
"""
from __future__ import annotations

import os
import time

from llamabatch.engines import RunnerChoice, register_runner

from fake_runner import FakeRunner

MODULE = "supervised_child_runner"


def fake(config):
    """The scripted fake: replies "<prompt>!", a few ms per tick so cancels can land mid-request."""
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, step_delay=0.005)


def always_aborts(config):
    """A runner that takes the process down at every decode, whatever the request."""
    def hook(call_no, plan):
        os.abort()
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, hook=hook)


def slow_grammar(config):
    """Prompts starting with "slow" take 30 s to sample each token (a costly grammar): they are
    sampled apart from the tick, so the others finish meanwhile and a cancel still lands."""
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, step_delay=0.005,
                      sample_delay=lambda ctx: 30.0 if ctx.startswith("slow") else 0.0)


HANG = "this prompt hangs the child"


def slow(config):
    """The fake at 50 ms per tick: a line of 20 tokens takes about a second, long enough to stop the child mid-run."""
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, step_delay=0.05)


def hangs_on_prompt(config):
    """The fake, except that sampling for a prompt containing HANG never returns (a llama.cpp call that hangs)."""
    def reply(prompt):
        if HANG in prompt:
            time.sleep(3600)
        return prompt + "!"
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, step_delay=0.005, reply=reply)


POISON = "this prompt takes the process down"


def aborts_on_poison(config):
    """The fake at 20 ms a tick, except that sampling for a prompt containing POISON takes the
    process down (as llama.cpp's abort on a grammar it cannot follow does): the supervised
    child, or the whole command when the engine runs in its process."""
    def reply(prompt):
        if POISON in prompt:
            os.abort()
        return prompt + "!"
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, step_delay=0.02, reply=reply)


def aborts_after_two_steps(config):
    """Each child runs two steps, then takes the process down: the engine works, yet no request ever finishes."""
    def hook(call_no, plan):
        if call_no > 2:
            os.abort()
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, hook=hook)


def slow_load(config):
    """The fake after a 60 s "model load" that reads no stdin meanwhile (as llama.cpp's load does not)."""
    time.sleep(60)
    return fake(config)


def loads_in_3s(config):
    """The fake after a 3 s "model load": long enough to probe the server while it loads."""
    time.sleep(3)
    return fake(config)


RESTART_MARK_ENV = "LLAMABATCH_TEST_RESTART_MARK"  # a file path: its presence says "not the first start"


def aborts_on_poison_slow_restart(config):
    """aborts_on_poison, whose every start after the first takes 1.5 s (a model load again):
    long enough to see the server while its engine restarts. The first start leaves the file
    named by $LLAMABATCH_TEST_RESTART_MARK behind (a child remembers nothing of the last one)."""
    mark = os.environ[RESTART_MARK_ENV]
    if os.path.exists(mark):
        time.sleep(1.5)
    else:
        open(mark, "w").close()
    return aborts_on_poison(config)


def choice(name: str = "fake") -> RunnerChoice:
    """What an engine in another process is told to run: the runner `name` of this module."""
    return RunnerChoice(name, MODULE)


for _runner in (fake, always_aborts, slow_grammar, slow, hangs_on_prompt, aborts_on_poison, aborts_after_two_steps,
                slow_load, loads_in_3s, aborts_on_poison_slow_restart):
    register_runner(_runner.__name__, _runner)
