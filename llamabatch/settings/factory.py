"""EngineFactory: resolved settings -> an engine, in this process or supervised.

A command resolves its settings once (file_layer.resolve_settings) and hands them here.
The factory finishes them (loading.prepare: the model checked, "auto" slots measured, once)
and builds an Engine over a loaded runner, or a SupervisedEngine whose child loads it.

The CLI's Environment holds one factory. Tests hand it one whose runner is the scripted
fake, in this process or in the supervised child (tests/cli_harness.py), and whose slot
chooser measures nothing, so the paths the real CLI takes (auto slots, supervision) run
in the fast suite too. Each part a test may replace is one method.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import EngineConfig
from .loading import load_runner, prepare
from .resolved import Resolved
from .slots import measure_on_model

if TYPE_CHECKING:
    from ..core.engine import Engine
    from ..supervised.engine import SupervisedEngine


class EngineFactory:
    """Builds the engine a command asks for from its resolved settings."""

    def open(self, resolved: Resolved, *, max_slots: int | None = None, isolated: bool = False,
             watchdog_s: float | None = None) -> "Engine | SupervisedEngine":
        """`isolated`: llama.cpp in a supervised child process (a crash costs a restart);
        `max_slots`: the most slots "auto" may choose (e.g. the number of input lines);
        `watchdog_s`: the supervised engine's watchdog floor (None: its default; 0: off).
        Raises ModelLoadError (one line) for a model that cannot load."""
        resolved = prepare(resolved, max_slots, self.choose_slots)
        if isolated:
            return self.supervised(resolved, watchdog_s)
        return self.in_process(resolved)

    def choose_slots(self, config: EngineConfig, model_path: str, max_slots: int | None) -> Any:
        """n_parallel "auto" -> an autoslots.Choice: measured on the model (or from the cache)."""
        return measure_on_model(config, model_path, max_slots)

    def load_runner(self, config: EngineConfig) -> Any:
        """The runner an in-process engine runs: the model, loaded."""
        return load_runner(config)

    def child_environment(self) -> dict[str, str] | None:
        """The supervised child's environment (None: this process's)."""
        return None

    def in_process(self, resolved: Resolved) -> "Engine":
        from ..core.engine import Engine

        return Engine(resolved.engine, runner=self.load_runner(resolved.engine), default_params=resolved.sampling,
                      slots_reason=resolved.slots_reason)

    def supervised(self, resolved: Resolved, watchdog_s: float | None = None) -> "SupervisedEngine":
        from ..supervised import SupervisedEngine

        bounds = {} if watchdog_s is None else {"watchdog_s": watchdog_s}
        return SupervisedEngine(settings=resolved, env=self.child_environment(), **bounds)
