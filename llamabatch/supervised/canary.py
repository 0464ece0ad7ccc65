"""Whose fault is a crash: the lines', or the engine's whatever it runs?

The poison rule (llamabatch/core/poison.py) blames requests, which is right when the engine
works and one request breaks it. When the engine breaks on everything (a setting llama.cpp
aborts on at the first decode, such as `--threads 100000` -> std::bad_alloc; a broken build),
the rule would blame every line in turn. So, after a crash, while no child of this engine
has ever finished a single step, the supervised engine first runs a *canary*: a built-in
one-token request, alone in a fresh child. The canary finishing clears the engine (the
quarantine then goes on as usual); the canary crashing too is an engine error: the engine
stops with `fatal_error` (run: one line naming the settings, exit 1, the lines unanswered
so --resume runs them; no line is blamed).
"""
from __future__ import annotations

from ..config import EngineConfig
from ..params import SamplingParams

CANARY_PID = -1  # never a request id: the parent's ids start at 0
CANARY_PROMPT = "Hello"
CANARY_PARAMS = SamplingParams(max_tokens=1, temperature=0.0, seed=0)

# Settings worth naming when the engine crashes whatever it runs (what a user can change), the
# likeliest first. Not the model: the CLI always resolves it to a path, so it always "differs".
_NAMED = ("threads", "n_ctx", "n_parallel", "n_batch", "chunk_size", "n_gpu_layers", "cpu_buffers", "kv_unified",
          "deterministic", "policy", "grammar_backend", "speculative")


def settings_hint(config: EngineConfig) -> str:
    """The engine settings set away from their defaults, e.g. "threads=100000, n_ctx=1024"."""
    defaults = EngineConfig()
    changed = [f"{name}={getattr(config, name)!r}" if isinstance(getattr(config, name), str)
               else f"{name}={getattr(config, name)}"
               for name in _NAMED if getattr(config, name) != getattr(defaults, name)]
    return ", ".join(changed)


def engine_error(crashes: int, how: str, config: EngineConfig, canary: bool) -> str:
    """One line: the engine process crashes whatever it runs, and what to look at."""
    what = ("the last time running only a built-in one-token test request" if canary
            else "with no request finishing in between")
    hint = settings_hint(config)
    look = (f"check these settings: {hint} (then the model file and the llama.cpp build)" if hint
            else "check the model file and the llama.cpp build")
    return (f"the engine process crashes whatever it runs: it died {crashes} times before finishing a single "
            f"step, {what} ({how}); the input lines are not the cause: {look}")

