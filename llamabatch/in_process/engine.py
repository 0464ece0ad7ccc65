"""`llamabatch.Engine`: the in-process engine as library users and the factory build it.

The core engine (core/engine.py) runs over a runner it is given and imports nothing above it.
This class stands between: without a runner it makes the settings ready once (settings/ready.py:
the model chosen and checked, the slots decided) and loads the model (runners.py); it hands the
core what lives in higher layers: the chat templates, the disk prefix store (opened once the
core has checked the config) and the name records give the model.
"""
from __future__ import annotations

from typing import Any, Callable

from ..config import EngineConfig
from ..core.engine import EngineCore
from ..params import SamplingParams
from ..settings.ready import ready
from .engine_parts import GgufChatTemplates, open_disk_prefixes
from .runners import load_model


class Engine(EngineCore):
    """A continuous-batching engine over one model, in this process (llamabatch.api.EngineAPI).
    Use it as a context manager.

    `runner`: run this runner instead of loading the model; its slots are the engine's
    (n_parallel "auto" becomes runner.n_slots)."""

    def __init__(self, config: EngineConfig | None = None, *, runner: Any = None,
                 default_params: SamplingParams | None = None,
                 on_notice: Callable[[str], None] | None = None, slots_reason: str = ""):
        if runner is None:
            resolved = ready(config, default_params)
            runner = load_model(resolved.engine)
            config, default_params, slots_reason = resolved.engine, resolved.sampling, resolved.slots_reason
        config = config or EngineConfig()  # checked once, by EngineCore
        if config.n_parallel == "auto":
            config = config.replace(n_parallel=runner.n_slots)
        if not config.model_name:
            from ..models.resolve import model_display_name

            config = config.replace(model_name=model_display_name(runner.model_path))
        super().__init__(config, runner=runner, default_params=default_params, on_notice=on_notice,
                         slots_reason=slots_reason, chat_templates=GgufChatTemplates(),
                         open_disk=open_disk_prefixes)
