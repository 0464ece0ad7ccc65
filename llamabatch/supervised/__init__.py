"""The engine in a supervised child process: a llama.cpp abort costs a restart, not the run.

`SupervisedEngine` has the Engine API; `run` and `serve-stdin` use it by default. The rule
that finds the request causing a crash lives in llamabatch/core/poison.py (shared with Ray).
"""
from .engine import ENGINE_CRASHED, ENGINE_UNAVAILABLE, SupervisedEngine

__all__ = ["SupervisedEngine", "ENGINE_CRASHED", "ENGINE_UNAVAILABLE"]
