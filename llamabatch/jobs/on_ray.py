"""A job on Ray (`ray=`, `llamabatch run --ray`): its engines started on Ray workers
(llamabatch.engines.open_pool).

Everything else (reader, writer, resume, progress, stopping) is the job's own code: the pool
stands where the Engine stands in a local job.
"""
from __future__ import annotations

from typing import Any, Callable

from ..engines import open_pool
from ..engines.opening import RAY_INSTALL_HINT
from ..errors import InvalidRequest
from ..settings.resolved import Resolved

LOCAL = "local"  # --ray without an ADDRESS: start a Ray instance on this machine


def require_ray() -> None:
    """InvalidRequest saying how to install Ray when it is not: checked before anything opens."""
    try:
        import ray  # noqa: F401  (the check only: cluster/pool.py is the module that uses it)
    except ImportError:
        raise InvalidRequest(RAY_INSTALL_HINT) from None


def open_ray_engines(resolved: Resolved, spec: Any, *, note: Callable[[str], None], max_slots: int | None,
                     watchdog_s: float | None, host: Any) -> Any:
    """The RayPool for `spec`'s ray settings. With n_parallel "auto" (the default) each worker
    measures or reuses its own node's choice, bounded by `max_slots` (the input's line count).
    `host.debug`: workers' logs reach this process. Raises ClusterStartError (one line)."""
    return open_cluster(resolved, spec.ray, workers=spec.ray_workers, cpus_per_worker=spec.ray_cpus_per_worker,
                        gpus_per_worker=spec.ray_gpus_per_worker, note=note, max_slots=max_slots,
                        watchdog_s=watchdog_s, debug=host.debug, factory=host.engine_factory)


def open_cluster(resolved: Resolved, address: str, *, workers: int | None, cpus_per_worker: int | None,
                 gpus_per_worker: float | None, note: Callable[[str], None], max_slots: int | None = None,
                 watchdog_s: float | None = None, debug: bool = False, factory: Any = None,
                 extra_slots: int = 0) -> Any:
    """Engines on the Ray workers at `address` (LOCAL: a Ray instance of this process's own),
    for `run --ray` and `serve --ray` alike; `extra_slots` on each reserved for online requests.
    Raises ClusterStartError (one line)."""
    if resolved.sources.get("threads", "default") != "default":
        note("--threads is not used with --ray: each engine runs --ray-cpus-per-worker threads")
    return open_pool(resolved, address=None if address == LOCAL else address, workers=workers,
                     cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker or 0.0,
                     max_slots=max_slots, watchdog_s=watchdog_s, log_to_driver=debug, note=note, factory=factory,
                     extra_slots=extra_slots)
