"""The one place n_parallel "auto" becomes a slot count: `choose_slots`.

The count is measured on the resolved model file (llama/autoslots.py, cached per machine),
bounded by the memory the KV cache needs and, when the caller knows it, by the number of
requests. An explicit count passes through unchanged. `planned_slots` says what the choice
would be from the cache alone (a dry run measures nothing); `most_slots` the most it may be.
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


def planned_slots(config: EngineConfig, model_path: str,
                  max_slots: int | None = None) -> tuple[int | None, dict[int, float], int | None]:
    """What `choose_slots` would decide, from this machine's calibration cache alone (nothing is
    measured: a dry run's estimate): (the slot count, or None when this model, thread count
    and machine were never calibrated; the calibration {slots: decode tok/s}; when it was
    measured, epoch seconds). An explicit n_parallel is itself."""
    from ..llama import autoslots
    from ..kernel_paths.cpu_buffers import chosen

    entry = autoslots.read_cache(autoslots.cache_key(model_path, config.n_threads, chosen(config.cpu_buffers),
                                                     autoslots.kv_setting(config)))
    measured = dict(entry["measured"]) if entry else {}
    when = entry.get("at") if entry else None
    if config.n_parallel != "auto":
        return int(config.n_parallel), measured, when
    if not measured:
        return None, {}, None
    limit, _why = autoslots.bounds(config, entry.get("kv_bytes_per_token"), autoslots.available_memory(), max_slots,
                                   autoslots.weights_size(model_path))
    return autoslots.pick(measured, limit), measured, when


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
