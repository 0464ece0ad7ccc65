"""How n_parallel "auto" becomes a slot count (ready.choose_slots asks `measure_on_model`).

The count is measured on the resolved model file (llama/autoslots.py, cached per machine),
bounded by the memory the KV cache needs and, when the caller knows it, by the number of
requests. An explicit count passes through unchanged. `planned_slots` says what the choice
would be from the cache alone (a dry run measures nothing); `most_slots` the most it may be.
"""
from __future__ import annotations

from typing import Callable

from ..config import EngineConfig

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
    if entry is not None and autoslots.timed_when_busy(entry, autoslots.load_per_core()):
        entry = None  # the run itself would measure again: no guess from a curve timed beside other work
    measured = dict(entry["measured"]) if entry else {}
    when = entry.get("at") if entry else None
    if config.n_parallel != "auto":
        return int(config.n_parallel), measured, when
    if not measured:
        return None, {}, None
    limit, _why = autoslots.bounds(config, entry.get("kv_bytes_per_token"), autoslots.available_memory(), max_slots,
                                   autoslots.weights_size(model_path))
    return autoslots.pick(measured, limit), measured, when
