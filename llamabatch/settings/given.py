"""Settings given as values rather than layers: an EngineConfig a library user wrote, or the
settings another process resolved and sent (the supervised child's parent).
"""
from __future__ import annotations

from ..config import EngineConfig
from ..params import SamplingParams
from .model import choose_model
from .resolved import Resolved


def settings_for(config: EngineConfig | None = None, params: SamplingParams | None = None) -> Resolved:
    """Library use (no flags, no config file): `config` and the default `params`, with the
    model resolved ($LLAMABATCH_MODEL or the bundled one when `config.model` is None)."""
    return choose_model(Resolved((config or EngineConfig()).validate(), (params or SamplingParams()).validate()))


def from_parent(config: EngineConfig, params: SamplingParams) -> Resolved:
    """Settings another process resolved: `config.model` is already the file,
    `config.model_name` what records call it; nothing is resolved again."""
    from ..models.resolve import model_display_name
    from ..models.stores import ModelRef

    ref = ModelRef(config.model, config.model_name or model_display_name(config.model), "file")
    return Resolved(config, params, model=ref)
