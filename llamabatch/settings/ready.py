"""Settings made ready to load, in one place: one value, resolved once, handed down.

From the settings a caller gave (an EngineConfig and its default SamplingParams, or the
Resolved a command built from its layers), `ready` makes the value an engine is built from:

- the model: its spelling turned into a file (`choose_model`: aliases, stores, folders,
  $LLAMABATCH_MODEL, the bundled one), then checked a readable GGUF (`check_model`);
- the slots: n_parallel "auto" made a count (`choose_slots`, measured on the model), the
  slots kept for online requests added on top (`with_extra_slots`), and n_ctx auto's slots
  made no larger than max_memory holds (`with_memory_fit`).

Each step sees whether it was done already (a command that sized its context first, a
settings value from a parent process), so nothing is resolved twice; nothing below an engine
resolves or checks these settings again. `prepare` is the same steps for a value whose model is
chosen: the supervised child and Ray workers decide "auto" on their own machine with it.
"""
from __future__ import annotations

from typing import Mapping

from ..config import EngineConfig
from ..params import SamplingParams
from .resolved import Resolved
from .slots import SlotChooser, measure_on_model


def ready(spec: Resolved | EngineConfig | None = None, params: SamplingParams | None = None,
          max_slots: int | None = None, chooser: SlotChooser = measure_on_model, *,
          extra_slots: int = 0) -> Resolved:
    """The settings a caller gave (a Resolved, or an EngineConfig with default `params`) made
    ready to load: see `settings_for` and `prepare`."""
    resolved = spec if isinstance(spec, Resolved) else settings_for(spec, params)
    return prepare(resolved, max_slots, chooser, extra_slots=extra_slots)


def settings_for(config: EngineConfig | None = None, params: SamplingParams | None = None) -> Resolved:
    """Library use (no flags, no config file): `config` and the default `params`, checked, with
    the model resolved ($LLAMABATCH_MODEL or the bundled one when `config.model` is None). The
    default sampling is valid as it is: only params the caller gave are checked (a config is
    checked either way: the check also reads its sizes and paths into numbers and None)."""
    engine = (config or EngineConfig()).validate()
    sampling = params.validate() if params is not None else SamplingParams()
    return choose_model(Resolved(engine, sampling))


def from_parent(config: EngineConfig, params: SamplingParams) -> Resolved:
    """Settings another process resolved: `config.model` is already the file,
    `config.model_name` what records call it; nothing is resolved again."""
    from ..models.resolve import model_display_name
    from ..models.stores import ModelRef

    ref = ModelRef(config.model, config.model_name or model_display_name(config.model), "file")
    return Resolved(config, params, model=ref)


def choose_model(resolved: Resolved, aliases: Mapping[str, str] | None = None,
                 config_path: str | None = None) -> Resolved:
    """`resolved` with its model spelling turned into a GGUF file (aliases from the config
    file's [models] table, store names, folders, $LLAMABATCH_MODEL, the bundled one).

    The display name stays the user's spelling (or an explicit model_name); a store's
    default stops (Ollama's params layer) fill `stop` only where no layer set one, as Ollama
    does. Raises ModelLoadError (one line) for a name that matches nothing; whether the file
    is a readable GGUF is checked by `prepare`, so a command checks its own files first. A
    value already resolved is returned as it is."""
    if resolved.model_resolved:
        return resolved
    from ..models.resolve import resolve_model_ref

    ref = resolve_model_ref(resolved.engine.model, dict(aliases or {}), config_path)
    out = resolved.replace(model=ref, engine=resolved.engine.replace(
        model=ref.path, model_name=resolved.engine.model_name or ref.name))
    if ref.stop and not out.sampling.stop and out.sources.get("stop", "default") == "default":
        out.sampling = out.sampling.replace(stop=list(ref.stop))
        out.sources["stop"] = f"model ({ref.source})"
    return out


def check_model(resolved: Resolved) -> None:
    """Raise ModelLoadError (one line) unless the resolved model is a readable GGUF file:
    before anything is measured, loaded or started."""
    from ..models.gguf_header import check_gguf

    check_gguf(resolved.engine.model)


def prepare(resolved: Resolved, max_slots: int | None = None, chooser: SlotChooser = measure_on_model, *,
            extra_slots: int = 0, fit_memory: bool = True) -> Resolved:
    """`resolved` ready to load: its model (chosen by `choose_model`) checked if it was not,
    n_parallel "auto" made a count (bounded by `max_slots`), `extra_slots` added on top, and
    with `fit_memory` n_ctx auto's slots made no larger than max_memory holds (off for a
    caller that sizes the context itself first: the engine's own prepare fits what it leaves
    unset)."""
    if not resolved.model_resolved:
        raise ValueError("prepare needs the model resolved first (settings.ready.choose_model)")
    if not resolved.model_checked:
        check_model(resolved)
        resolved = resolved.replace(model_checked=True)
    resolved = with_extra_slots(choose_slots(resolved, max_slots, chooser), extra_slots)
    return with_memory_fit(resolved) if fit_memory else resolved


def choose_slots(resolved: Resolved, max_slots: int | None = None,
                 chooser: SlotChooser = measure_on_model) -> Resolved:
    """`resolved` with n_parallel an integer and `slots_reason` saying why (auto only).
    The model must be resolved first (`choose_model`): the measure runs on its file."""
    if resolved.slots_resolved:
        return resolved
    if not resolved.model_resolved:
        raise ValueError("choose_slots needs the model resolved first (settings.ready.choose_model)")
    choice = chooser(resolved.engine, resolved.engine.model, max_slots)
    engine = resolved.engine.replace(n_parallel=choice.n_parallel).validate()
    return resolved.replace(engine=engine, slots_reason=choice.reason)


def with_extra_slots(resolved: Resolved, extra: int) -> Resolved:
    """`resolved` (n_parallel a count) with `extra` more slots, each as large as the others (a
    set --n-ctx grows by their share, an unset one follows n_parallel), reserved for requests
    above the default priority (EngineConfig.reserved_slots). serve opens its engine this way,
    so the slots it keeps for online requests come on top of the batch's, not out of them
    (--online-slots, docs/serve.md)."""
    if extra <= 0:
        return resolved
    config = resolved.engine
    n = int(config.n_parallel)
    n_ctx = config.n_ctx + extra * (config.n_ctx // n) if config.n_ctx else config.n_ctx
    engine = config.replace(n_parallel=n + extra, n_ctx=n_ctx, n_batch=max(config.n_batch, n + extra),
                            reserved_slots=config.reserved_slots + extra).validate()
    return resolved.replace(engine=engine)


def fit_in_memory(resolved: Resolved) -> tuple[Resolved, str] | None:
    """n_ctx auto, n_parallel a count, where slots of a default 4,096 tokens would take more
    than max_memory allows beside the weights: `resolved` with each slot what it holds, and
    why (context_sizing.slot_in_memory: the rule `run --dry-run` reports too); None when
    nothing changes."""
    from .context_sizing import slot_in_memory

    fit = slot_in_memory(resolved.engine, resolved.engine.model)
    if fit is None:
        return None
    tokens, why = fit
    engine = resolved.engine.replace(n_ctx=tokens * int(resolved.engine.n_parallel)).validate()
    return resolved.replace(engine=engine), why


def with_memory_fit(resolved: Resolved) -> Resolved:
    """`fit_in_memory`'s slots where it changes them, its why in the header's reasons in place
    of "4,096 tokens a slot hold every line" (run's, said before the slots were counted)."""
    from .context_sizing import DEFAULT_SLOT_REASON

    fitted = fit_in_memory(resolved)
    if fitted is None:
        return resolved
    sized, why = fitted
    kept = [part for part in (resolved.slots_reason or "").split("; ") if part and part != DEFAULT_SLOT_REASON]
    return sized.replace(slots_reason="; ".join(kept + [why]))
