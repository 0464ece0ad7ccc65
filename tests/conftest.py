"""Shared fixtures. Integration tests run the bundled Gemma 3 270M for real, and the tests of
architecture-dependent engine paths also SmolLM2-135M-Instruct (`family`, below).

Every test that needs the bundled model is marked `model`, so `python -m pytest -q -m "not
model"` runs the fast suite (the scripted fake runner, no model). A test that uses one of
MODEL_FIXTURES (directly or through another fixture) is marked here; a test that starts a
real process on the model without them carries `@pytest.mark.model` itself.
"""
from __future__ import annotations

import functools
import gc
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

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


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct from the `instruct` extra (the README's test command installs it)."""
    from llamabatch.models.resolve import resolve_model_ref

    return resolve_model_ref("smollm2").path


# -- two model families -----------------------------------------------------------------------
# The tests of engine paths that depend on the architecture (sliding window or not, KV fork,
# prefix reuse, vocabulary size for logprobs and grammars, kernel shapes of deterministic mode,
# chat templates, auto slots) take `family` and run once on each: Gemma 3 270M base (gemma3,
# Q4_K_M, 262k vocabulary, 512-token sliding window) and SmolLM2-135M-Instruct (llama, Q4_1,
# 49k vocabulary, full attention, ChatML template in the GGUF). Module-scoped, so a module's
# engine fixtures built on it load each model once.

@dataclass(frozen=True)
class Family:
    name: str  # the test id
    path: str
    sliding_window: int | None  # tokens; None: full attention in every layer


FAMILIES = {"gemma3": ("model_path", 512), "smollm2": ("smollm2_path", None)}


@pytest.fixture(scope="module")
def family(request) -> Family:
    fixture, window = FAMILIES[request.param]
    return Family(request.param, request.getfixturevalue(fixture), window)


def _family_paths(paths: list[str]) -> list[tuple[str, str]]:
    """(family, cpu_path) pairs. SmolLM2 skips "repack": llama.cpp has no repacked layout for
    Q4_1 (nor for its tied Q8_0 embedding), so the loader leaves every tensor in the plain CPU
    buffer and the repack path would run the very same kernels again."""
    return [("gemma3", p) for p in paths] + [("smollm2", p) for p in paths if p != "repack"]


@pytest.fixture
def settings_sandbox(tmp_path, monkeypatch):
    """For tests of settings layers: no LLAMABATCH_* from the outside, an empty per-user config
    dir, cwd in a fresh folder (where a local llamabatch.toml would be found); that folder."""
    for name in list(os.environ):
        if name.startswith("LLAMABATCH_") and name != "LLAMABATCH_CACHE_DIR":  # the suite's own (pytest_configure)
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


# Fixtures that bring a model: `model_path`, `smollm2_path`, `family`, and test_models.py's
# `shared_cache`, which assembles the 250 MB model into a fresh cache folder.
MODEL_FIXTURES = {"model_path", "smollm2_path", "family", "shared_cache"}


# tryfirst: xdist's own hook reads the xdist_group marks to name each test's group; ours must
# have added them by then (without it the model tests ran on every worker at once).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if item.path.name in SOURCE_SCANS and not item.get_closest_marker("model"):
            item.add_marker(pytest.mark.xdist_group("source_scans"))
    _into_model_lanes([item for item in items if item.get_closest_marker("model")])
    # xdist hands tests out in this order: the tests that mostly wait on real processes' timers
    # go first, so their waits overlap the others' CPU instead of ending the run on one worker
    items.sort(key=lambda item: item.path.name not in WAITING_MODULES)  # stable: files keep their order


# -- model lanes ---------------------------------------------------------------------------
# Model tests run one at a time in each of a few lanes, a lane on an xdist worker of its own and
# pinned to its share of the CPUs, so llama.cpp in it (in the test's process and in every
# process it starts, which inherit the affinity) takes that share's threads: the engine's
# default thread count is the CPUs a process may use. Two lanes of llama.cpp threads that are
# not pinned wait for each other at every graph node; pinned, each lane's single-threaded time
# (Python, process starts, model loads: most of a model test) overlaps the other's. A module
# stays in one lane, so its module-scoped engines load once.

def _lane_cpus() -> list[set[int]]:
    if not hasattr(os, "sched_getaffinity"):  # no CPU affinity on this OS: one lane, not pinned
        return [set()]
    cpus = sorted(os.sched_getaffinity(0))
    lanes = min(MODEL_LANES, len(cpus))
    return [set(cpus[lane::lanes]) for lane in range(lanes)]


MODEL_LANES = 2
LANE_CPUS = _lane_cpus()
ALL_CPUS = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def _into_model_lanes(model_items: list[pytest.Item]) -> None:
    """Each module's model tests into the lane with the fewest model tests so far, the modules
    with the most first. A module with an xdist group of its own (a Ray cluster's) keeps it."""
    tests_in: dict = {}
    for item in model_items:
        tests_in[item.path] = tests_in.get(item.path, 0) + 1
    load = [0] * len(LANE_CPUS)
    lane_of = {}
    for path, count in sorted(tests_in.items(), key=lambda entry: (-entry[1], str(entry[0]))):
        lane_of[path] = load.index(min(load))
        load[lane_of[path]] += count
    for item in model_items:
        if item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("model"))
        else:
            item.stash[MODEL_LANE] = lane_of[item.path]
            item.add_marker(pytest.mark.xdist_group(f"model_lane_{lane_of[item.path]}"))


MODEL_LANE = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # tryfirst: before the test's fixtures start an engine, whose threads follow the affinity.
    # Only in an xdist worker: run serially (-n 0), every test has the machine to itself.
    if hasattr(item.config, "workerinput") and ALL_CPUS:
        lane = item.stash.get(MODEL_LANE, None)
        os.sched_setaffinity(0, ALL_CPUS if lane is None else LANE_CPUS[lane])


# Modules whose time is mostly waiting on real processes (watchdogs, restarts, Ray's start):
# in a run of the fast suite they took 160 s of wall time for 45 CPU-s.
WAITING_MODULES = {"test_supervised_faults_cli.py", "test_serve_http_restart.py", "test_supervised_faults.py",
                   "test_engine_contract.py", "test_jobs_api.py", "test_chat_sessions.py", "test_serve_http.py",
                   "test_serve_http_edges.py", "test_serve_http_online.py", "test_serve_http_health.py",
                   "test_serve_ray.py"}


# Modules whose rules walk the syntax trees of every llamabatch module (test_import_graph.py's
# `parsed` keeps them). One worker runs them all, so the package is parsed once, and the trees
# (about 400,000 objects) are let go after the last of them: every full garbage collection
# later in that worker, and pytest's five at its exit, would walk them again otherwise.
SOURCE_SCANS = {"test_import_graph.py", "test_layering.py"}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if item.path.name in SOURCE_SCANS and (nextitem is None or nextitem.path.name not in SOURCE_SCANS):
        import test_import_graph

        test_import_graph.forget_parsed()


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection imported (llamabatch, its dependencies, the test modules) lives as long as
    # the worker. Frozen, the garbage collector stops walking it in every full collection.
    gc.collect()
    gc.freeze()


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
    from llamabatch.kernel_paths import cpu_buffers
    from llamabatch.llama.cpu_kernels import cpu_extra_buffer_types

    extras = list(cpu_extra_buffer_types())
    paths = cpu_buffers.test_paths(extras, lambda: cpu_buffers.amx_verdict(resolve_model(None)))
    return paths, f"extra CPU buffer types in this llama.cpp build: {', '.join(extras) or 'none'}"


def pytest_report_header(config):
    paths, why = _cpu_paths()
    return [f"llamabatch cpu_buffers paths covered by the numerics tests: {', '.join(paths)} ({why})"]


def pytest_generate_tests(metafunc):
    names = metafunc.fixturenames
    if "family" in names and "cpu_path" in names:
        metafunc.parametrize(("family", "cpu_path"), _family_paths(_cpu_paths()[0]), indirect=["family"],
                             scope="module", ids=lambda value: value)
    elif "family" in names:
        metafunc.parametrize("family", list(FAMILIES), indirect=True, scope="module")
    elif "cpu_path" in names:
        metafunc.parametrize("cpu_path", _cpu_paths()[0], scope="module")


def pytest_xdist_auto_num_workers(config):
    """pyproject's `-n auto`. The fast suite is mostly processes waiting, and on 2 cores 6 workers
    overlap more of it than 4 (7 alternated pairs, 4 workers' time over 6's: 1.13, 1.20, 0.99,
    0.95, 1.10, 1.14, 1.14; 8 workers gained nothing over 6). Where model tests run, 4: one for
    each model lane and two for the rest, whose CPU competes with the lanes' llama.cpp threads."""
    return 6 if "not model" in (config.option.markexpr or "") else 4


def pytest_configure(config):
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile("fast")
    if not hasattr(config, "workerinput"):  # the controller; xdist's workers inherit its environment
        _own_cache_folder(config)


def _own_cache_folder(config) -> None:
    """The suite's own cache folder (LLAMABATCH_CACHE_DIR) for every test and every process a
    test starts, removed at the end: the auto-slot calibrations the suite makes are timed under
    its own load, and written to the user's cache they became the slot count a later `llamabatch
    run --n-parallel auto` trusted there; nothing else the suite makes belongs there either."""
    folder = tempfile.mkdtemp(prefix="llamabatch-test-cache-")
    os.environ["LLAMABATCH_CACHE_DIR"] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.fixture(autouse=True)
def _own_prefix_store(tmp_path_factory, monkeypatch):
    """Every test gets an empty disk prefix store of its own (the commands' default is on, in
    the user's cache folder): what one test saves never serves another, and nothing is written
    to the home of whoever runs the suite. Processes a test starts inherit it."""
    # mkdtemp, not tmp_path_factory.mktemp: that one lists the whole base folder to number its
    # folders, which grows by two every test
    monkeypatch.setenv("LLAMABATCH_PREFIX_STORE", tempfile.mkdtemp(prefix="prefix-store-",
                                                                   dir=tmp_path_factory.getbasetemp()))
