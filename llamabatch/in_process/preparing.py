"""Resolved settings made ready to load: the model checked and n_parallel "auto" made a count.

`prepare` is the one call that finishes a Resolved before an engine is built from it, in
this process (factory.py), in the supervised child and on a Ray worker (worker_engine.py):
the model named by the settings layer (settings/model.py) is checked, and "auto" is decided
by settings/slots.py, once, on the machine that runs the engine.
"""
from __future__ import annotations

from ..settings.model import choose_model
from ..settings.resolved import Resolved
from ..settings.slots import SlotChooser, choose_slots, measure_on_model


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
