"""The `family_engine` fixtures' shared body (test_engine_model.py, test_n_samples_model.py)."""
from __future__ import annotations

from llamabatch import Engine, EngineConfig


def family_engine_of(request, family, **config):
    """The module's own `engine` fixture for Gemma (one model load for both), else an Engine on
    the family's model with the same `config`."""
    if family.name == "gemma3":
        yield request.getfixturevalue("engine")
        return
    with Engine(EngineConfig(model=family.path, **config)) as eng:
        yield eng
