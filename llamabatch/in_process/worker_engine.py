"""The in-process engine of a process that serves another: the supervised child and a Ray
worker build theirs here, over the settings their parent (or driver) resolved.

n_parallel "auto" is decided here, on this process's machine (a Ray worker's node has its own
CPUs and memory), by the same settings.ready.prepare every engine goes through. A registered
runner (runners.RunnerChoice) runs as given: it stands for a model that is never loaded.
"""
from __future__ import annotations

from ..settings.resolved import Resolved
from .engine import Engine
from ..settings.ready import prepare, with_extra_slots
from .runners import RunnerChoice, make_runner


def open_worker_engine(resolved: Resolved, runner: RunnerChoice | None = None,
                       max_slots: int | None = None, extra_slots: int = 0) -> Engine:
    """An Engine over `resolved`: the model checked, "auto" decided (bounded by `max_slots`)
    and loaded, or the registered runner `runner`. `extra_slots`: reserved for requests above
    the default priority, on top of the slots decided (serve --ray's --online-slots, per worker).
    Raises ModelLoadError (one line)."""
    if runner is None:
        resolved = prepare(resolved, max_slots, extra_slots=extra_slots)
    elif extra_slots:
        resolved = with_extra_slots(resolved, extra_slots)
    return Engine(resolved.engine, runner=make_runner(runner, resolved.engine), default_params=resolved.sampling,
                  slots_reason=resolved.slots_reason)
