"""The supervised engine with the scripted fake runner in its child: a child that aborts costs a
restart, never the other requests. (tests/test_supervised_cli.py does the same on the model.)

The crash is planted with the child's test-only hook: LLAMABATCH_TEST_CRASH_PROMPT=TEXT makes
the child call os.abort() when the request whose prompt is TEXT yields its first token, as
llama.cpp does on an assertion or a C++ throw.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamabatch import Delta, EngineConfig, ModelLoadError, SamplingParams
from llamabatch.supervised import ENGINE_CRASHED, SupervisedEngine
from llamabatch.supervised.child import CRASH_AT_LOAD_ENV, CRASH_PROMPT_ENV

from child_tools import child_env
from supervised_child_runner import choice

DOOMED = "this prompt makes the child abort"
CONFIG = EngineConfig(n_parallel=4, n_ctx=1024, threads=1)
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(autouse=True)
def _bundled_model(model_path):
    """The parent resolves the bundled model before starting a child (assembled once)."""


def test_planted_crash_isolates_the_one_request_and_the_others_finish():
    with SupervisedEngine(CONFIG, default_params=GREEDY, env=child_env(**{CRASH_PROMPT_ENV: DOOMED}),
                          runner=choice()) as engine:
        prompts = [f"Count from {i}:" for i in range(10)]
        prompts.insert(5, DOOMED)
        streamed: dict[int, list[str]] = {}

        def on_item(handle, item) -> None:
            if isinstance(item, Delta):
                streamed.setdefault(handle.request_id, []).append(item.text)

        handles = [engine.submit(p, stream=False, callback=on_item) for p in prompts]
        results = [h.result(timeout=120) for h in handles]
        bad = results[5]
        assert bad.finish_reason == "error" and bad.error_code == ENGINE_CRASHED
        assert "SIGABRT" in bad.error and CRASH_PROMPT_ENV in bad.error  # the signal and the child's last line
        others = results[:5] + results[6:]
        assert all(r.finish_reason == "length" and r.usage.completion_tokens == 6 for r in others)
        assert [r.text for r in others] == [p[:6] for p in prompts[:5] + prompts[6:]]  # the fake echoes
        for h, r in zip(handles, results):  # a retried request streams no text twice
            if r.ok:
                assert "".join(streamed.get(h.request_id, [])) == r.text
        assert engine.isolated == [handles[5].request_id]
        assert engine.restarts >= 2
        stats = engine.stats()
        assert (stats.submitted, stats.finished, stats.failed) == (11, 10, 1)
        # the restarted child serves as before, and cancel reaches it
        long = engine.submit("Tell me a story.", SamplingParams(max_tokens=400, temperature=0, ignore_eos=True))
        next(iter(long))  # it is generating
        long.cancel()
        assert long.result(timeout=60).finish_reason == "cancelled"
        assert engine.stats().cancelled == 1
        with engine.hold():  # held in the parent, not yet sent: a cancel ends it at once
            held = engine.submit("Hello")
            held.cancel()
            assert held.done and held.result().finish_reason == "cancelled"


def test_a_child_that_dies_at_load_is_one_model_load_error():
    with pytest.raises(ModelLoadError) as info:
        SupervisedEngine(CONFIG, env=child_env(**{CRASH_AT_LOAD_ENV: "1"}), runner=choice())
    message = str(info.value)
    assert "died 3 times" in message and "SIGABRT" in message and CRASH_AT_LOAD_ENV in message
    assert "\n" not in message
