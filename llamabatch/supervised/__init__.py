"""The engine in a supervised child process: a llama.cpp abort costs a restart, not the run.

`SupervisedEngine` has the Engine API; `run` and `serve-stdin` use it by default. The rule
that finds the request causing a crash lives in llamabatch/core/poison.py (shared with Ray).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import ENGINE_CRASHED, ENGINE_UNAVAILABLE, SupervisedEngine

__all__ = ["SupervisedEngine", "ENGINE_CRASHED", "ENGINE_UNAVAILABLE"]


def __getattr__(name: str):
    # Loaded on first use: the CLI reads the watchdog's defaults (watchdog.py) for its --help
    # without loading the engine the child runs.
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
