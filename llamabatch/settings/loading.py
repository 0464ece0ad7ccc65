"""From resolved settings to a loaded runner: the one path every engine's model takes.

`prepare` finishes a Resolved (the model, checked; the slot count) and `load_runner` loads
the model into a LlamaRunner. The engine factory (factory.py), Engine(EngineConfig(...))
for library users, SupervisedEngine and the supervised child all come through here, so
each setting is resolved once, in one place, whichever engine is built.
"""
from __future__ import annotations

from typing import Any

from ..config import EngineConfig
from ..params import SamplingParams
from .model import choose_model
from .resolved import Resolved
from .slots import SlotChooser, choose_slots, measure_on_model


def settings_for(config: EngineConfig | None = None, params: SamplingParams | None = None) -> Resolved:
    """Library use (no flags, no config file): `config` and the default `params`, with the
    model resolved ($LLAMABATCH_MODEL or the bundled one when `config.model` is None)."""
    return choose_model(Resolved((config or EngineConfig()).validate(), (params or SamplingParams()).validate()))


def from_parent(config: EngineConfig, params: SamplingParams) -> Resolved:
    """Settings another process resolved (the supervised child's parent): `config.model` is
    already the file, `config.model_name` what records call it; nothing is resolved again."""
    from ..models.resolve import model_display_name
    from ..models.stores import ModelRef

    ref = ModelRef(config.model, config.model_name or model_display_name(config.model), "file")
    return Resolved(config, params, model=ref)


def check_model(resolved: Resolved) -> None:
    """Raise ModelLoadError (one line) unless the resolved model is a readable GGUF file:
    before anything is measured, loaded or started."""
    from ..models.resolve import check_gguf

    check_gguf(resolved.engine.model)


def prepare(resolved: Resolved, max_slots: int | None = None, chooser: SlotChooser = measure_on_model) -> Resolved:
    """`resolved` ready to load: the model resolved (if it was not) and checked, and
    n_parallel "auto" made a count (bounded by `max_slots`)."""
    resolved = choose_model(resolved)
    check_model(resolved)
    return choose_slots(resolved, max_slots, chooser)


def load_runner(config: EngineConfig) -> Any:
    """The model `config` names (a resolved file), loaded: the real runner."""
    from ..llama.runner import LlamaRunner  # llama/ alone imports llama_cpp; kept lazy

    return LlamaRunner(config, config.model)


def open_runner(resolved: Resolved, max_slots: int | None = None) -> tuple[Resolved, Any]:
    """prepare + load_runner: what Engine(EngineConfig(...)) does for library users."""
    resolved = prepare(resolved, max_slots)
    return resolved, load_runner(resolved.engine)
