"""n_parallel "auto": the choice within bounds, the cache, and explicit values winning.
Scripted measurements, except the last tests, which calibrate on the bundled model."""
from __future__ import annotations

import json

import pytest

from llamabatch import EngineConfig
from llamabatch.llama.autoslots import CANDIDATES, cache_path, choose, kv_bytes_per_token, pick
from llamabatch.settings.layers import merge

GIB = 2**30
GEMMA_META = {"general.architecture": "gemma3", "gemma3.block_count": "18", "gemma3.attention.head_count": "4",
              "gemma3.attention.head_count_kv": "1", "gemma3.embedding_length": "640",
              "gemma3.attention.key_length": "256", "gemma3.attention.value_length": "256"}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    from llamabatch.llama import autoslots

    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autoslots, "load_per_core", lambda: None)  # the suite's own load: no stamp, no measuring again


class Curve:
    """A scripted calibration: tok/s per slot count, and a record of what was asked."""

    def __init__(self, curve: dict[int, float], per_token: int = 18 * 1024):
        self.curve, self.per_token, self.calls = curve, per_token, []

    def __call__(self, levels):
        self.calls.append(list(levels))
        return {n: self.curve.get(n, 1.0) for n in levels}, self.per_token


AUTO = EngineConfig(n_parallel="auto", threads=2)
MODEL = __file__  # any existing file: the cache key reads its size and mtime


def test_kv_bytes_per_token_from_gguf_metadata():
    assert kv_bytes_per_token(GEMMA_META) == 18 * 1024  # 18 layers x 1 KV head x (256 + 256) x 2 bytes
    assert kv_bytes_per_token({"general.architecture": "x"}) is None


def test_the_smallest_count_within_five_percent_of_the_best_wins():
    assert pick({4: 80, 8: 120, 12: 118, 16: 121}, 32) == 8
    assert pick({4: 80, 8: 100, 16: 140}, 32) == 16
    assert pick({4: 80, 8: 100, 16: 140}, 12) == 8  # 16 is past the bound


def test_auto_measures_the_candidates_and_says_why():
    curve = Curve({4: 84, 8: 122, 12: 110, 16: 171, 24: 160, 32: 150})
    choice = choose(AUTO, MODEL, measure=curve, memory=64 * GIB)
    assert choice.n_parallel == 16
    assert choice.reason == "auto: 1.40x over 8 here"
    assert curve.calls == [list(CANDIDATES)]


def test_auto_is_bounded_by_the_number_of_input_lines():
    curve = Curve({4: 84, 8: 122, 10: 130, 16: 171})
    choice = choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=10)
    assert curve.calls == [[4, 8, 10]]  # never measures more slots than lines
    assert choice.n_parallel == 10 and choice.reason == "auto: bounded by 10 input lines"
    few = Curve({})
    assert choose(AUTO, MODEL, measure=few, max_slots=3).n_parallel == 3
    assert few.calls == []  # nothing to choose between: no calibration
    assert choose(AUTO, MODEL, measure=few, max_slots=1).n_parallel == 1


def test_auto_is_bounded_by_memory_for_the_kv_cache():
    # 4096 tokens x 18 KiB = 72 MiB per slot; half of 0.5 GiB holds 3 slots
    curve = Curve({4: 84, 8: 122, 16: 171})
    choice = choose(AUTO, MODEL, measure=curve, memory=GIB // 2)
    assert choice.n_parallel == 3
    assert choice.reason.startswith("auto: bounded by KV memory: 72 MiB per slot")


def test_auto_under_one_max_memory_fits_about_twice_the_slots_with_a_q8_0_cache():
    # more slots always faster: the choice is the memory bound. max_memory 1 GiB less this file's "weights"
    q8 = AUTO.replace(cache_type_k="q8_0", cache_type_v="q8_0", max_memory="1GiB")
    f16 = AUTO.replace(max_memory="1GiB")
    rising = {n: 10.0 * n for n in range(1, max(CANDIDATES) + 1)}
    got = {}
    for config in (f16, q8):
        per_token = kv_bytes_per_token(GEMMA_META, config.cache_type_k, config.cache_type_v)
        choice = choose(config, MODEL, measure=Curve(rising, per_token), memory=64 * GIB)
        assert "max_memory 1GiB less the weights" in choice.reason
        got[config.cache_type_k] = choice.n_parallel
    assert got == {"f16": 14, "q8_0": 26}  # 72 MiB and 38.25 MiB a slot of 4096 tokens


def test_the_calibration_cache_keeps_cache_types_apart():
    curve = Curve({n: 100.0 for n in CANDIDATES})
    choose(AUTO, MODEL, measure=curve, memory=64 * GIB)
    again = choose(AUTO.replace(cache_type_k="q8_0", cache_type_v="q8_0"), MODEL, measure=curve, memory=64 * GIB)
    assert not again.from_cache and len(curve.calls) == 2
    assert len(json.loads(cache_path().read_text())) == 2


def test_the_calibration_cache_keeps_kv_layouts_apart():
    curve = Curve({n: 100.0 for n in CANDIDATES})
    choose(AUTO, MODEL, measure=curve, memory=64 * GIB)
    shared = choose(AUTO.replace(kv_unified=True), MODEL, measure=curve, memory=64 * GIB)
    assert not shared.from_cache and len(curve.calls) == 2
    assert choose(AUTO.replace(kv_unified=True), MODEL, measure=curve, memory=64 * GIB).from_cache
    assert len(curve.calls) == 2


def test_auto_reuses_its_cache_and_measures_only_what_is_missing():
    curve = Curve({4: 84, 8: 122, 12: 110, 16: 171, 24: 160, 32: 150})
    first = choose(AUTO, MODEL, measure=curve, memory=64 * GIB)
    again = choose(AUTO, MODEL, measure=curve, memory=64 * GIB)
    assert len(curve.calls) == 1 and not first.from_cache and again.from_cache
    assert again.n_parallel == first.n_parallel == 16
    stored = json.loads(cache_path().read_text())
    (entry,) = stored.values()
    assert entry["measured"]["16"] == 171 and entry["kv_bytes_per_token"] == 18 * 1024
    choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=10)  # 10 was never measured
    assert curve.calls[1:] == [[10]]
    other_threads = choose(AUTO.replace(threads=1), MODEL, measure=curve, memory=64 * GIB)
    assert not other_threads.from_cache and len(curve.calls) == 3  # keyed by threads too


def test_a_curve_timed_on_a_busy_machine_is_measured_again_once_the_machine_is_quiet():
    curve = Curve({4: 84, 8: 122, 16: 171})
    busy = choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=16, load_now=lambda: 2.5)
    (entry,) = json.loads(cache_path().read_text()).values()
    assert not busy.from_cache and entry["load"] == 2.5
    still_busy = choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=16, load_now=lambda: 1.8)
    assert still_busy.from_cache and len(curve.calls) == 1  # measuring beside the same work would not be better
    between = choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=16, load_now=lambda: 0.7)
    assert between.from_cache and len(curve.calls) == 1
    curve.curve = {4: 84, 8: 160, 16: 150}  # what the quiet machine measures
    quiet = choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=16, load_now=lambda: 0.2)
    assert not quiet.from_cache and curve.calls[1] == [4, 8, 16] and quiet.n_parallel == 8
    (entry,) = json.loads(cache_path().read_text()).values()
    assert entry["load"] == 0.2
    assert choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=16, load_now=lambda: 2.5).from_cache
    assert len(curve.calls) == 2  # a quiet curve is kept whatever the load later


def test_a_dry_run_makes_no_guess_from_a_busy_curve_the_run_would_measure_again(monkeypatch):
    from llamabatch.llama import autoslots
    from llamabatch.settings.slots import planned_slots

    monkeypatch.setattr(autoslots, "available_memory", lambda: 64 * GIB)
    choose(AUTO, MODEL, measure=Curve({4: 84, 8: 122}), memory=64 * GIB, max_slots=8, load_now=lambda: 2.5)
    assert planned_slots(AUTO, MODEL, 8)[0] == 8  # the load unknown (the fixture): the curve serves
    monkeypatch.setattr(autoslots, "load_per_core", lambda: 0.1)
    assert planned_slots(AUTO, MODEL, 8) == (None, {}, None)


def test_a_curve_with_no_load_recorded_is_kept(monkeypatch):
    curve = Curve({4: 84, 8: 122})
    choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=8, load_now=lambda: None)
    (entry,) = json.loads(cache_path().read_text()).values()
    assert "load" not in entry
    assert choose(AUTO, MODEL, measure=curve, memory=64 * GIB, max_slots=8, load_now=lambda: 0.0).from_cache


def test_planned_slots_reads_the_same_choice_from_the_cache_and_measures_nothing(monkeypatch):
    from llamabatch.llama import autoslots
    from llamabatch.settings.slots import planned_slots

    assert planned_slots(AUTO, MODEL, 10) == (None, {}, None)  # never calibrated: no guess
    curve = Curve({4: 84, 8: 122, 12: 110, 16: 171, 24: 160, 32: 150})
    monkeypatch.setattr(autoslots, "available_memory", lambda: 64 * GIB)
    chosen = choose(AUTO, MODEL, measure=curve, memory=64 * GIB)
    slots, measured, at = planned_slots(AUTO, MODEL)
    assert slots == chosen.n_parallel == 16 and measured[16] == 171 and isinstance(at, int)
    assert planned_slots(AUTO, MODEL, 6)[0] == pick(measured, 6)  # bounded by the lines, as choose is
    assert planned_slots(EngineConfig(n_parallel=3, threads=2), MODEL)[0] == 3
    assert len(curve.calls) == 1


def test_an_unreadable_cache_means_measuring_again():
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text("not json")
    curve = Curve({8: 100})
    assert choose(AUTO, MODEL, measure=curve, memory=64 * GIB).n_parallel == 8
    assert len(curve.calls) == 1


def test_an_explicit_count_always_wins():
    curve = Curve({16: 1000})
    choice = choose(EngineConfig(n_parallel=3), MODEL, measure=curve)
    assert choice.n_parallel == 3 and choice.reason == "" and curve.calls == []


def test_run_and_serve_default_to_auto_chat_to_one_and_a_flag_or_env_wins(monkeypatch):
    monkeypatch.delenv("LLAMABATCH_N_PARALLEL", raising=False)
    assert merge({}, "run").engine.n_parallel == "auto"
    assert merge({}, "serve-stdin").engine.n_parallel == "auto"
    assert merge({}, "chat").engine.n_parallel == 1
    assert merge({"n_parallel": "3"}, "run").engine.n_parallel == 3
    assert merge({"n_parallel": "auto"}, "chat").engine.n_parallel == "auto"
    monkeypatch.setenv("LLAMABATCH_N_PARALLEL", "5")
    assert merge({}, "run").engine.n_parallel == 5
    assert merge({"n_parallel": "2"}, "run").engine.n_parallel == 2


@pytest.mark.parametrize("bad", ["0", "many", "-3"])
def test_bad_slot_counts_are_usage_errors(bad):
    from llamabatch.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="n_parallel|--n-parallel"):
        merge({"n_parallel": bad}, "run")


# -- on the bundled model (and SmolLM2: `family`) -----------------------------------------------

@pytest.mark.model
def test_real_calibration_picks_a_measured_count_and_caches_it(family):
    config = EngineConfig(model=family.path, n_parallel="auto")
    choice = choose(config, family.path, max_slots=8)  # measures 4 and 8: about a second
    assert choice.n_parallel in (4, 8) and set(choice.measured) == {4, 8}
    assert all(v > 0 for v in choice.measured.values())
    assert choose(config, family.path, max_slots=8).from_cache
    (entry,) = json.loads(cache_path().read_text()).values()
    # gemma3: 18 layers x 1 KV head x (256 + 256) x 2 bytes; llama (SmolLM2) says no key_length:
    # 30 layers x 3 KV heads x (576 / 9 heads = 64, twice) x 2 bytes
    assert entry["kv_bytes_per_token"] == {"gemma3": 18 * 1024, "smollm2": 30 * 3 * (64 + 64) * 2}[family.name]


@pytest.mark.model
def test_run_header_says_what_auto_chose_and_an_explicit_count_wins(tmp_path, model_path):
    import subprocess
    import sys

    inp = tmp_path / "three.txt"
    inp.write_text("The sky is\nWater is\nFire is\n")
    common = ["--model", model_path, "--n-ctx", "1536", "--max-tokens", "2", "--temperature", "0", "-t", "1"]
    auto = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(inp), *common],
                          capture_output=True, text=True, timeout=180)
    assert auto.returncode == 0, auto.stderr
    assert "3 slots x 512 tokens (auto: bounded by 3 input lines)" in auto.stderr
    explicit = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(inp), "--n-parallel", "2",
                               *common], capture_output=True, text=True, timeout=180)
    assert explicit.returncode == 0, explicit.stderr
    assert "2 slots x 768 tokens," in explicit.stderr and "(auto:" not in explicit.stderr
    assert len(auto.stdout.splitlines()) == len(explicit.stdout.splitlines()) == 3
