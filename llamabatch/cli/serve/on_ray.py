"""`serve --ray [ADDRESS]`: the server's engines on Ray workers (the pool `run --ray` uses),
opened while the server answers 503 "loading"."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ClusterStartError
from ..env import Environment
from ..exit_status import EXIT_USAGE, fail

if TYPE_CHECKING:
    from ...settings.resolved import Resolved

RAY_HELP = ("Run the engines on Ray, one per worker; files, batches and their catalogue stay here. Alone: "
            "start a local Ray instance; auto, HOST:PORT or ray://HOST:PORT: join that cluster.")
WORKERS_HELP = "Engines \\[default: one per node that has the CPUs]."
CPUS_HELP = "CPUs per engine, also its llama.cpp threads \\[default: all CPUs of a node, shared by its engines]."
GPUS_HELP = "GPUs per engine (CUDA builds; with --n-gpu-layers)."


def open_ray_engines(resolved: "Resolved", env: Environment, address: str, workers: int | None,
                     cpus_per_worker: int | None, gpus_per_worker: float | None, online_slots: int = 0) -> Any:
    """The RayPool, every worker's model loaded, each engine with `online_slots` more slots
    reserved for online requests. A cluster that can't be reached or can't hold the engines is
    bad input for the server: one line, exit 2, before it listens."""
    from ...jobs.on_ray import open_cluster, require_ray

    require_ray()
    try:
        pool = open_cluster(resolved, address, workers=workers, cpus_per_worker=cpus_per_worker,
                            gpus_per_worker=gpus_per_worker, debug=env.debug, factory=env.engine_factory,
                            extra_slots=online_slots,
                            note=lambda line: env.say(line.replace("llamabatch run:", "llamabatch serve:", 1)))
    except ClusterStartError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    env.say(f"llamabatch serve: {pool.describe()}")
    return pool
