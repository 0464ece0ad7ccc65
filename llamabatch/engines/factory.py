"""EngineFactory: resolved settings -> an engine, in this process, supervised or on Ray.

The factory builds, from settings made ready once by open_engine (settings/ready.py: the
model checked, "auto" slots decided), an Engine over a loaded runner or a SupervisedEngine
whose child loads it; or, from resolved settings, a RayPool whose workers decide "auto" on
their own nodes.

The CLI's Environment holds one factory, and jobs take one. Tests hand it one whose runner
is the scripted fake, in this process or, by a registered name (runners.py), in the
supervised child and on Ray workers (tests/cli_harness.py), and whose slot chooser
measures nothing, so the paths the real CLI takes (auto slots, supervision) run in the
fast suite too. Each part a test may replace is one method.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..config import EngineConfig
from ..settings.resolved import Resolved
from ..settings.slots import measure_on_model
from ..in_process.runners import RunnerChoice, make_runner

if TYPE_CHECKING:
    from ..cluster.pool import RayPool
    from ..supervised.engine import SupervisedEngine
    from ..in_process.engine import Engine


class EngineFactory:
    """Builds the engine a caller asks for from its resolved settings."""

    def open(self, resolved: Resolved, *, isolated: bool = False,
             watchdog_s: float | None = None) -> "Engine | SupervisedEngine":
        """`resolved`: as settings.ready made it (open_engine's). `isolated`: llama.cpp in a
        supervised child process (a crash costs a restart); `watchdog_s`: the supervised
        engine's watchdog floor (None: its default; 0: off). Raises ModelLoadError (one line)
        for a model that cannot load."""
        if isolated:
            return self.supervised(resolved, watchdog_s)
        return self.in_process(resolved)

    def choose_slots(self, config: EngineConfig, model_path: str, max_slots: int | None) -> Any:
        """n_parallel "auto" -> an autoslots.Choice: measured on the model (or from the cache)."""
        return measure_on_model(config, model_path, max_slots)

    def runner_choice(self) -> RunnerChoice | None:
        """The runner engines in other processes (the supervised child, Ray workers) run:
        None, the model, loaded."""
        return None

    def load_runner(self, config: EngineConfig) -> Any:
        """The runner an in-process engine runs: the model, loaded."""
        return make_runner(self.runner_choice(), config)

    def child_environment(self) -> dict[str, str] | None:
        """The supervised child's environment (None: this process's)."""
        return None

    def in_process(self, resolved: Resolved) -> "Engine":
        from ..in_process.engine import Engine

        return Engine(resolved.engine, runner=self.load_runner(resolved.engine), default_params=resolved.sampling,
                      slots_reason=resolved.slots_reason)

    def supervised(self, resolved: Resolved, watchdog_s: float | None = None) -> "SupervisedEngine":
        from ..supervised import SupervisedEngine

        bounds = {} if watchdog_s is None else {"watchdog_s": watchdog_s}
        return SupervisedEngine(settings=resolved, env=self.child_environment(), runner=self.runner_choice(),
                                **bounds)

    def ray_pool(self, resolved: Resolved, *, address: str | None, workers: int | None,
                 cpus_per_worker: int | None, gpus_per_worker: float, max_slots: int | None,
                 watchdog_s: float | None, log_to_driver: bool, note: Callable[[str], None],
                 extra_slots: int = 0) -> "RayPool":
        """Engines on Ray workers (cluster/pool.py, imported here: it imports ray). Each worker
        decides "auto" on its own node, bounded by `max_slots`, and reserves `extra_slots` more
        for online requests. Raises ClusterStartError."""
        from ..cluster.pool import RayPool

        bounds = {} if watchdog_s is None else {"watchdog_s": watchdog_s}
        return RayPool.start(resolved.engine, resolved.sampling, address=address, workers=workers,
                             cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                             log_to_driver=log_to_driver, note=note, max_slots=max_slots,
                             runner=self.runner_choice(), extra_slots=extra_slots, **bounds)
