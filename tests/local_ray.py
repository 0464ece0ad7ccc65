"""A local Ray instance for a test module whose Ray workers run registered fake runners
(supervised_child_runner.py): started with tests/ on its processes' PYTHONPATH, stopped after."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from child_tools import TESTS


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    import ray

    # Ray's processes inherit the environment ray.init sees (restored right after). Not
    # runtime_env: with one, every actor waits for a worker process of its own (seconds each)
    # instead of taking one Ray started beforehand.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        mp.setenv("PYTHONPATH", TESTS)
        mp.delenv("LLAMABATCH_MODEL", raising=False)
        for attempt in (1, 2):
            try:
                # "local": never another test's cluster running on this machine at the same time
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
                break
            except Exception:  # "The current node timed out during startup" (Ray's fixed 30 s): a loaded machine
                ray.shutdown()
                if attempt == 2:
                    raise
    try:
        yield
    finally:
        ray.shutdown()
