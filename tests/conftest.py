"""Shared fixtures. Integration tests run the bundled Gemma 3 270M for real.

Every test that needs the bundled model is marked `model`, so `python -m pytest -q -m "not
model"` runs the fast suite (the scripted fake runner, no model). A test that uses one of
MODEL_FIXTURES (directly or through another fixture) is marked here; a test that starts a
real process on the model without them carries `@pytest.mark.model` itself.
"""
from __future__ import annotations

import functools
import os
import sys

import pytest
from hypothesis import settings

from llamabatch.models.resolve import resolve_model

# Machines of this kind set PYTHONDONTWRITEBYTECODE=1. Then every `python -m llamabatch` a test
# starts compiles the package from source again (0.55 s of its 1.0 s start), and pytest rewrites
# every test module's asserts again (collection 6.9 s instead of 1.6 s). The suite starts a few
# hundred such processes; bytecode caches go to __pycache__/ (git-ignored) and change no result.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture(scope="session")
def model_path() -> str:
    """The bundled default model (assembled once into the cache folder)."""
    return resolve_model(None)


# Fixtures that bring the bundled model: `model_path`, and test_models.py's `shared_cache`,
# which assembles the 250 MB model into a fresh cache folder.
MODEL_FIXTURES = {"model_path", "shared_cache"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if item.get_closest_marker("model"):
            # One at a time, in file order, on one xdist worker: model tests load the model with
            # 2 threads each and some measure time; two at once on 2 cores would only slow
            # both, and a module's model fixture is loaded once, not once per worker.
            item.add_marker(pytest.mark.xdist_group("model"))


# Hypothesis profiles for tests/test_fuzz.py: "fast" in the normal suite (a few seconds), "long"
# for a deliberate fuzzing session: pytest tests/test_fuzz.py --hypothesis-profile=long
settings.register_profile("fast", max_examples=40, deadline=None, derandomize=False)
settings.register_profile("long", max_examples=2000, deadline=None)


# -- CPU weight layouts -----------------------------------------------------------------------
# llama.cpp's kernels differ with the weight layout (cpu_buffers: plain, CPU_REPACK, AMX), and a
# row's rounding with them. Tests of numerics-sensitive features take the `cpu_path` fixture
# and run once per layout this machine can run; the header line says which were covered.

@functools.lru_cache(maxsize=1)
def _cpu_paths() -> tuple[list[str], str]:
    from llamabatch.llama import cpu_buffers
    from llamabatch.llama.cpu_kernels import cpu_extra_buffer_types

    extras = list(cpu_extra_buffer_types())
    paths = cpu_buffers.test_paths(extras, lambda: cpu_buffers.amx_verdict(resolve_model(None)))
    return paths, f"extra CPU buffer types in this llama.cpp build: {', '.join(extras) or 'none'}"


def pytest_report_header(config):
    paths, why = _cpu_paths()
    return [f"llamabatch cpu_buffers paths covered by the numerics tests: {', '.join(paths)} ({why})"]


def pytest_generate_tests(metafunc):
    if "cpu_path" in metafunc.fixturenames:
        metafunc.parametrize("cpu_path", _cpu_paths()[0], scope="module")


def pytest_configure(config):
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile("fast")
