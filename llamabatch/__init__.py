"""llamabatch: continuous batching for many prompts on one local GGUF model.

    from llamabatch import Engine, EngineConfig, SamplingParams

    with Engine(EngineConfig(n_parallel=8)) as engine:
        for r in engine.generate(["Once upon a time"], SamplingParams(max_tokens=32)):
            print(r.text)

    from llamabatch import run_job, run_frame   # batch jobs (llamabatch.jobs, docs/library.md)

    report = run_job("prompts.jsonl", "results.jsonl")
"""
from __future__ import annotations

import logging

from .config import EngineConfig
from .core.handle import RequestHandle
from .errors import (ContextOverflow, DecodeError, DeterminismUnavailable, EngineClosed, InvalidRequest, LlamaBatchError, ModelLoadError, QueueFull)
from .params import SamplingParams
from .results import Delta, Result, Timings, Usage
from .core.telemetry import EngineStats, RequestRecord, TickRecord

from .version import __version__

# A library logs; the application decides where it goes (the CLI shows it with --debug).
logging.getLogger("llamabatch").addHandler(logging.NullHandler())

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "RequestHandle", "SamplingParams", "Result", "Delta", "Usage",
    "Timings", "TickRecord", "RequestRecord", "LlamaBatchError", "InvalidRequest", "ContextOverflow", "QueueFull",
    "ModelLoadError", "DecodeError", "EngineClosed", "DeterminismUnavailable", "__version__", "run_job", "run_frame",
]


def __getattr__(name: str):
    # Loaded on first use, so that `import llamabatch` (and with it every `llamabatch` command,
    # `--help` and each shell completion) does not pay for what it does not run: the engine
    # (numpy, the scheduler) when `Engine` is first named, the jobs package when a job is first run.
    if name == "Engine":
        from .engines import Engine

        return Engine
    if name == "run_job":
        from .jobs.job import run_job

        return run_job
    if name == "run_frame":
        from .jobs.frames import run_frame

        return run_frame
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
