"""A job on Ray (`ray=`, `llamabatch run --ray`): reaching Ray and starting the engines on it.

Everything else (reader, writer, resume, progress, stopping) is the job's own code: the pool
from llamabatch/cluster/pool.py stands where the Engine stands in a local job.
"""
from __future__ import annotations

import os
from typing import Callable

from ..settings.resolved import Resolved
from ..errors import ClusterStartError, InvalidRequest

INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'llamabatch[ray]'"
LOCAL = "local"  # --ray without an ADDRESS: start a Ray instance on this machine


def import_ray_pool(address: str):
    """The ray_pool module; InvalidRequest saying how to install Ray when it is missing."""
    if address == LOCAL:
        # A Ray instance of our own serves this machine only: Ray then gives its node the
        # loopback address instead of the machine's network one (read when ray is imported).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        from ..cluster import pool as ray_pool
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        raise InvalidRequest(INSTALL_HINT) from None
    return ray_pool


def open_pool(ray_pool, resolved: Resolved, address: str, workers: int | None, cpus: int | None,
              gpus: float | None, note: Callable[[str], None], max_slots: int | None = None,
              watchdog_s: float | None = None, debug: bool = False):
    """Start the engines on Ray; anything that stops them is one ClusterStartError line, before any work.
    With n_parallel "auto" (the default) each worker measures or reuses its own node's choice,
    bounded by `max_slots` (the input's line count); the header names each worker's.
    `debug` (--debug): workers' logs reach the driver, and a start failure keeps its traceback."""
    if resolved.sources.get("threads", "default") != "default":
        note("llamabatch run: --threads is not used with --ray: each engine runs --ray-cpus-per-worker threads")
    try:
        return ray_pool.RayPool.start(resolved.engine, resolved.sampling,
                                      address=None if address == LOCAL else address, workers=workers,
                                      cpus_per_worker=cpus, gpus_per_worker=gpus or 0.0,
                                      log_to_driver=debug, note=note, max_slots=max_slots,
                                      **({} if watchdog_s is None else {"watchdog_s": watchdog_s}))
    except ray_pool.RayStartError as exc:
        if debug:
            raise
        raise ClusterStartError(str(exc)) from None
