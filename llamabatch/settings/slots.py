"""The one place n_parallel "auto" becomes a slot count: `choose_slots`.

The count is measured on the resolved model file (llama/autoslots.py, cached per machine),
bounded by the memory the KV cache needs and, when the caller knows it, by the number of
requests. An explicit count passes through unchanged.
"""
from __future__ import annotations

from typing import Callable

from ..config import EngineConfig
from .resolved import Resolved

SlotChooser = Callable[[EngineConfig, str, "int | None"], "object"]
"""(config, model file, max_slots) -> autoslots.Choice; the real one calibrates on the model."""


def measure_on_model(config: EngineConfig, model_path: str, max_slots: int | None):
    """The real chooser: llama/autoslots.choose, which calibrates on the model (or reads the cache)."""
    from ..llama.autoslots import choose

    return choose(config, model_path, max_slots=max_slots)


def most_slots(config: EngineConfig) -> int:
    """The most slots an engine with `config` may open: its n_parallel, or with "auto" the
    largest count the measure may choose (what a caller sizes for before the choice)."""
    if config.n_parallel != "auto":
        return int(config.n_parallel)
    from ..llama.autoslots import CANDIDATES

    return max(CANDIDATES)


def choose_slots(resolved: Resolved, max_slots: int | None = None,
                 chooser: SlotChooser = measure_on_model) -> Resolved:
    """`resolved` with n_parallel an integer and `slots_reason` saying why (auto only).
    The model must be resolved first (model.choose_model): the measure runs on its file."""
    if resolved.slots_resolved:
        return resolved
    if not resolved.model_resolved:
        raise ValueError("choose_slots needs the model resolved first (settings.model.choose_model)")
    choice = chooser(resolved.engine, resolved.engine.model, max_slots)
    engine = resolved.engine.replace(n_parallel=choice.n_parallel).validate()
    return resolved.replace(engine=engine, slots_reason=choice.reason)
