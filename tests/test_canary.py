"""The engine-error line when the engine crashes whatever it runs (llamabatch/supervised/canary.py)."""
from __future__ import annotations

from llamabatch import EngineConfig
from llamabatch.supervised.canary import engine_error, settings_hint


def test_the_hint_names_the_settings_away_from_their_defaults_likeliest_first():
    config = EngineConfig(model="/m.gguf", n_parallel=2, threads=100000, cpu_buffers="plain")
    assert settings_hint(config) == "threads=100000, n_parallel=2, cpu_buffers='plain'"
    assert settings_hint(EngineConfig(model="/m.gguf")) == ""


def test_the_engine_error_is_one_line_that_clears_the_input():
    line = engine_error(2, "killed by SIGABRT; last log line: std::bad_alloc", EngineConfig(threads=100000), True)
    assert "\n" not in line and "threads=100000" in line and "std::bad_alloc" in line
    assert "crashes whatever it runs" in line and "the input lines are not the cause" in line
    assert "model file" in engine_error(8, "killed by SIGSEGV", EngineConfig(), False)
