"""A slot restored from the disk prefix store keeps a prefix of what it holds only from the
restored end on (llama.cpp restores just the last n_swa positions of Gemma 3's window layers):
a later request sharing less of it gets the slot emptied, or no fork from it, never a cut that
would continue from missing cells. The fake runner flags such a cut as a violation."""
from __future__ import annotations

import time

from llamabatch import SamplingParams

from fake_runner import FakeRunner
from test_disk_prefix import INSTRUCTION, make_engine, reply_of, run_items

WAIT = 10


def test_a_request_sharing_less_than_a_restored_slot_holds_evaluates_instead_of_cutting_it(tmp_path):
    run_items(str(tmp_path), ["cat", "dog"])  # saves the instruction
    runner = FakeRunner(n_slots=1, slot_ctx=600, reply=reply_of)
    half = INSTRUCTION[: len(INSTRUCTION) // 2]
    with make_engine(runner, str(tmp_path)) as engine:
        first = engine.submit(INSTRUCTION + "cat").result(WAIT)
        longer = engine.submit(INSTRUCTION + "cat and more").result(WAIT)  # cut at or past the restored end: fine
        shorter = engine.submit(half + "owl").result(WAIT)  # shares only half of the restored part
    assert runner.violations == []
    assert first.usage.restored_tokens == len(INSTRUCTION)
    assert longer.text == "ORE" and longer.usage.cached_tokens >= len(INSTRUCTION)
    assert shorter.text == "OWL" and shorter.usage.cached_tokens == 0
    assert (0, 0) in runner.trims


def test_no_fork_cuts_a_restored_slot_short(tmp_path):
    run_items(str(tmp_path), ["cat", "dog"])
    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=reply_of, step_delay=0.002)
    half = INSTRUCTION[: len(INSTRUCTION) // 2]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    with make_engine(runner, str(tmp_path)) as engine:
        busy = engine.submit(INSTRUCTION + "cat", params)  # restored, then generating for a while
        deadline = time.monotonic() + WAIT
        while not runner.restores and time.monotonic() < deadline:
            time.sleep(0.002)
        other = engine.submit(half + "owl").result(WAIT)  # the busy slot shares only half: no fork
        assert busy.result(WAIT).ok
    assert runner.violations == []
    assert runner.restores and other.text == "OWL" and other.usage.cached_tokens == 0
