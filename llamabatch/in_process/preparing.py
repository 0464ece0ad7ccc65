"""Resolved settings made ready to load: the model checked and n_parallel "auto" made a count.

`prepare` is the one call that finishes a Resolved before an engine is built from it, in
this process (engines/opening.py), in the supervised child and on a Ray worker
(worker_engine.py): the model named by the settings layer (settings/model.py) is checked,
and "auto" is decided by settings/slots.py, once, on the machine that runs the engine. A step
already done (by a command that sized its context first) is not done again.
"""
from __future__ import annotations

from ..settings.resolved import Resolved
from ..settings.slots import SlotChooser, choose_slots, measure_on_model, with_extra_slots


def check_model(resolved: Resolved) -> None:
    """Raise ModelLoadError (one line) unless the resolved model is a readable GGUF file:
    before anything is measured, loaded or started."""
    from ..models.resolve import check_gguf

    check_gguf(resolved.engine.model)


def prepare(resolved: Resolved, max_slots: int | None = None, chooser: SlotChooser = measure_on_model, *,
            extra_slots: int = 0, fit_memory: bool = True) -> Resolved:
    """`resolved` ready to load: its model (chosen by the settings layer that made it:
    settings/model.choose_model) checked if it was not, n_parallel "auto" made a count
    (bounded by `max_slots`), `extra_slots` added on top (settings/slots.with_extra_slots),
    and with `fit_memory` n_ctx auto's slots made no larger than max_memory holds
    (`with_memory_fit`; off for a caller that sizes the context itself first: the engine's
    own prepare fits what it leaves unset)."""
    if not resolved.model_resolved:
        raise ValueError("prepare needs the model resolved first (settings.model.choose_model)")
    if not resolved.model_checked:
        check_model(resolved)
        resolved = resolved.replace(model_checked=True)
    resolved = with_extra_slots(choose_slots(resolved, max_slots, chooser), extra_slots)
    return with_memory_fit(resolved) if fit_memory else resolved


def fit_in_memory(resolved: Resolved) -> tuple[Resolved, str] | None:
    """n_ctx auto, n_parallel a count, where slots of a default 4,096 tokens would take more
    than max_memory allows beside the weights: `resolved` with each slot what it holds, and
    why (settings/context_sizing.slot_in_memory: the rule `run --dry-run` reports too); None
    when nothing changes."""
    from ..settings.context_sizing import slot_in_memory

    fit = slot_in_memory(resolved.engine, resolved.engine.model)
    if fit is None:
        return None
    tokens, why = fit
    engine = resolved.engine.replace(n_ctx=tokens * int(resolved.engine.n_parallel)).validate()
    return resolved.replace(engine=engine), why


def with_memory_fit(resolved: Resolved) -> Resolved:
    """`fit_in_memory`'s slots where it changes them, its why in the header's reasons in place
    of "4,096 tokens a slot hold every line" (run's, said before the slots were counted)."""
    from ..settings.context_sizing import DEFAULT_SLOT_REASON

    fitted = fit_in_memory(resolved)
    if fitted is None:
        return resolved
    sized, why = fitted
    kept = [part for part in (resolved.slots_reason or "").split("; ") if part and part != DEFAULT_SLOT_REASON]
    return sized.replace(slots_reason="; ".join(kept + [why]))
