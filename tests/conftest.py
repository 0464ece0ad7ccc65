"""Shared fixtures. Integration tests run the bundled Gemma 3 270M for real."""
from __future__ import annotations

import pytest

from llamabatch.models import resolve_model


@pytest.fixture(scope="session")
def model_path() -> str:
    """The bundled default model (assembled once into the cache folder)."""
    return resolve_model(None)
