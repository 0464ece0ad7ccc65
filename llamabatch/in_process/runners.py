"""Which runner an engine runs: the model its config names, loaded (the default), or a runner
registered under a name.

A registered runner serves tests (the scripted fake) and any host that brings its own. An
engine built in another process (the supervised child, a Ray worker) gets a `RunnerChoice`
in its start message: the name, and the module whose import registers it there. The module
is imported by name from that process's sys.path, never read from a file path.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ..config import EngineConfig
from ..errors import ModelLoadError

RunnerMaker = Callable[[EngineConfig], Any]
_registered: dict[str, RunnerMaker] = {}


@dataclass(frozen=True)
class RunnerChoice:
    """A registered runner, by name, and the importable module that registers it."""

    name: str
    module: str


def register_runner(name: str, make: RunnerMaker) -> None:
    """Make `make(config)` the runner of engines given RunnerChoice(name, ...)."""
    _registered[name] = make


def load_model(config: EngineConfig) -> Any:
    """The model `config` names (a resolved file), loaded into a LlamaRunner."""
    from ..llama.runner import LlamaRunner  # llama/ alone imports llama_cpp; kept lazy

    return LlamaRunner(config, config.model)


def make_runner(choice: RunnerChoice | None, config: EngineConfig) -> Any:
    """The runner `choice` names (None: the model, loaded). Raises ModelLoadError (one line)
    when the module cannot be imported or registers no runner of that name."""
    if choice is None:
        return load_model(config)
    if choice.name not in _registered:
        try:
            importlib.import_module(choice.module)
        except ImportError as exc:
            raise ModelLoadError(f"runner {choice.name!r}: cannot import {choice.module!r} ({exc})") from None
    make = _registered.get(choice.name)
    if make is None:
        raise ModelLoadError(f"runner {choice.name!r}: {choice.module!r} registers no runner of that name")
    return make(config)
