"""Runners for the supervised engine's child in unit tests (LLAMABATCH_TEST_CHILD_RUNNER=this file:NAME).

The child imports this file by path, so it puts tests/ on sys.path for fake_runner.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_runner import FakeRunner  # noqa: E402


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
