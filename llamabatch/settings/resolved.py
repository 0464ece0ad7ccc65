"""The one resolved value a command builds and the engine factory consumes."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import EngineConfig
from ..params import SamplingParams

if TYPE_CHECKING:
    from ..models.stores import ModelRef


@dataclass
class Resolved:
    """Every setting an engine needs, each from one layer, and where each came from.

    `engine.model` is the user's spelling until `ready.choose_model` runs; then it is the
    GGUF file, `engine.model_name` what records call it, and `model` how it was found.
    `engine.n_parallel` may still be "auto" until `ready.choose_slots` runs, which sets
    `slots_reason` (the header line's "why this many slots"). `model_checked`: the file was
    found a readable GGUF (ready.prepare), so nothing below checks it again."""

    engine: EngineConfig
    sampling: SamplingParams
    sources: dict[str, str] = field(default_factory=dict)  # key -> "flag" | "env LLAMABATCH_X" | "file:line" | "default"
    model: "ModelRef | None" = None  # None: the model is not resolved yet
    slots_reason: str = ""
    model_checked: bool = False
    layout_reason: str = ""  # the KV layout `run` chose from its file, and why (settings/kv_layout.py)

    def replace(self, **changes) -> "Resolved":
        return dataclasses.replace(self, sources=dict(self.sources), **changes)

    @property
    def model_resolved(self) -> bool:
        return self.model is not None

    @property
    def slots_resolved(self) -> bool:
        return self.engine.n_parallel != "auto"
