"""The settings layer (llamabatch/settings/): precedence flag > env > config file > default,
and each setting resolved exactly once on its way to the engine (the model, the store's
default stops, n_parallel "auto"), whichever engine the factory builds: in this process or
supervised with the fake runner in its child. No model is loaded."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.models import resolve as model_resolve
from llamabatch.models.stores import ModelRef
from llamabatch.settings.file_layer import resolve_settings
from llamabatch.settings.layers import merge
from llamabatch.settings.resolved import Resolved
from llamabatch.settings.ready import choose_model, choose_slots, prepare, settings_for
from llamabatch.supervised import SupervisedEngine

from cli_harness import FakeEngines, invoke, runner_for
from llamabatch.models.packaged import is_installed
from fake_runner import FakeRunner


# run's default without -m: the chat-tuned model's name when installed, else None (bundled)
DEFAULT = "smollm2" if is_installed("smollm2") else None


@pytest.fixture(autouse=True)
def clean_env(settings_sandbox):
    return settings_sandbox  # conftest.py: no outside LLAMABATCH_*, an empty config dir, cwd in tmp


@pytest.fixture
def counted_models(monkeypatch):
    """The real model resolver, counting its calls (every resolution goes through it)."""
    calls: list[str | None] = []
    real = model_resolve.resolve_model_ref

    def counting(model=None, aliases=None, config_path=None):
        calls.append(model)
        return real(model, aliases, config_path)

    monkeypatch.setattr(model_resolve, "resolve_model_ref", counting)
    return calls


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# -- precedence: flag > env > file > default ---------------------------------------------------

@pytest.mark.parametrize("layers, expected", [
    ((), (4096 * 2, "default")),
    (("file",), (512, "file")),
    (("file", "env"), (768, "env LLAMABATCH_N_CTX")),
    (("file", "env", "flag"), (1024, "flag")),
    (("env", "flag"), (1024, "flag")),
    (("file", "flag"), (1024, "flag")),
])
def test_each_layer_overrides_the_ones_below(clean_env, monkeypatch, layers, expected):
    flags = {"n_parallel": "2"}
    if "file" in layers:
        write(clean_env / "llamabatch.toml", "n_ctx = 512\n")
    if "env" in layers:
        monkeypatch.setenv("LLAMABATCH_N_CTX", "768")
    if "flag" in layers:
        flags["n_ctx"] = 1024
    resolved = resolve_settings(flags, "run")
    value, source = expected
    assert resolved.engine.total_ctx == value
    where = resolved.sources["n_ctx"]
    assert where == source or (source == "file" and where == f"{clean_env / 'llamabatch.toml'}:1")


def test_a_command_default_sits_below_every_other_layer(monkeypatch):
    assert merge({}, "chat").engine.n_parallel == 1
    assert merge({}, "chat").sources["n_parallel"] == "default (chat)"
    assert merge({}, "chat", {"n_parallel": (3, "f.toml:1")}).engine.n_parallel == 3
    monkeypatch.setenv("LLAMABATCH_N_PARALLEL", "auto")
    assert merge({}, "chat", {"n_parallel": (3, "f.toml:1")}).engine.n_parallel == "auto"


def test_merge_reads_the_environment_it_is_given():
    resolved = merge({}, "run", environ={"LLAMABATCH_TEMPERATURE": "0.25", "LLAMABATCH_STOP": "a,b"})
    assert resolved.sampling.temperature == 0.25 and resolved.sampling.stop == ["a", "b"]
    assert resolved.sources["stop"] == "env LLAMABATCH_STOP"


# -- the model: resolved once, a store's stops only where no layer set any --------------------

def _store_ref(monkeypatch, calls):
    def fake(model=None, aliases=None, config_path=None):
        calls.append(model)
        return ModelRef("/models/x.gguf", "ollama:x", "ollama", ("<end>",))
    monkeypatch.setattr(model_resolve, "resolve_model_ref", fake)


def test_choose_model_applies_a_store_default_stop_only_when_unset(monkeypatch):
    calls: list = []
    _store_ref(monkeypatch, calls)
    resolved = choose_model(merge({"model": "ollama:x"}, "run"))
    assert resolved.engine.model == "/models/x.gguf" and resolved.engine.model_name == "ollama:x"
    assert resolved.sampling.stop == ["<end>"] and resolved.sources["stop"] == "model (ollama)"
    flagged = choose_model(merge({"model": "ollama:x", "stop": ["###"]}, "run"))
    assert flagged.sampling.stop == ["###"] and flagged.sources["stop"] == "flag"
    assert choose_model(resolved) is resolved  # already resolved: nothing asked again
    assert calls == ["ollama:x", "ollama:x"]


def test_library_settings_resolve_the_model_the_same_way(monkeypatch):
    calls: list = []
    _store_ref(monkeypatch, calls)
    resolved = settings_for(EngineConfig(model="ollama:x", n_parallel=2), SamplingParams(max_tokens=3))
    assert resolved.sampling.stop == ["<end>"] and resolved.sampling.max_tokens == 3
    own = settings_for(EngineConfig(model="ollama:x", n_parallel=2), SamplingParams(stop=["."]))
    assert own.sampling.stop == ["."]
    assert len(calls) == 2


# -- slots: "auto" made a count once ----------------------------------------------------------

class CountingChooser:
    def __init__(self, n: int = 6):
        self.n, self.calls = n, []

    def __call__(self, config, model_path, max_slots):
        from llamabatch.llama.autoslots import Choice

        self.calls.append((model_path, max_slots))
        return Choice(self.n, f"auto: {self.n} here", {})


def test_choose_slots_needs_the_model_and_runs_once():
    chooser = CountingChooser()
    auto = Resolved(EngineConfig(n_parallel="auto"), SamplingParams())
    with pytest.raises(ValueError, match="model resolved first"):
        choose_slots(auto, chooser=chooser)
    ready = auto.replace(model=ModelRef("/m.gguf", "m", "file"), engine=auto.engine.replace(model="/m.gguf"))
    chosen = choose_slots(ready, max_slots=9, chooser=chooser)
    assert chosen.engine.n_parallel == 6 and chosen.slots_reason == "auto: 6 here"
    assert choose_slots(chosen, chooser=chooser) is chosen
    assert chooser.calls == [("/m.gguf", 9)]
    explicit = ready.replace(engine=ready.engine.replace(n_parallel=3))
    assert choose_slots(explicit, chooser=chooser).engine.n_parallel == 3 and len(chooser.calls) == 1


def test_prepare_checks_the_model_file_before_measuring(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    chooser = CountingChooser()
    resolved = choose_model(Resolved(EngineConfig(model=str(bad), n_parallel="auto"), SamplingParams()))
    with pytest.raises(Exception, match="not a GGUF file"):
        prepare(resolved, chooser=chooser)
    assert chooser.calls == []


# -- the engine factory: one resolution, whichever engine -------------------------------------

def test_engine_takes_resolved_settings_as_they_are():
    config = EngineConfig(model="/m/x.gguf", model_name="my-name", n_parallel=2, n_ctx=256)
    engine = Engine(config, runner=FakeRunner(n_slots=2, slot_ctx=128), default_params=SamplingParams(stop=["!"]),
                    slots_reason="auto: 2 here")
    try:
        assert engine.model_name == "my-name" and engine.slots_reason == "auto: 2 here"
        assert engine.default_params.stop == ["!"]
    finally:
        engine.close()


def _lines(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("".join(f"line {i}\n" for i in range(n)), encoding="utf-8")
    return path


def test_run_resolves_the_model_and_auto_slots_once(tmp_path, counted_models):
    factory = FakeEngines(runner_for(), [])
    result = invoke(["run", str(_lines(tmp_path, 3)), "--max-tokens", "3", "--n-ctx", "1536"], factory=factory)
    assert result.exit_code == 0, result.stderr
    assert counted_models == [DEFAULT]  # the default model, asked for once, before anything loads
    assert factory.slot_choices == [(3, 3)]  # auto, bounded by the 3 input lines, chosen once
    (engine,) = factory.engines
    assert engine.config.n_parallel == 3 and engine.slots_reason == "auto: bounded by 3 input lines"
    assert "3 slots x 512 tokens (auto: bounded by 3 input lines)" in result.stderr
    assert len(result.stdout.splitlines()) == 3


def test_auto_slots_without_a_line_count_take_the_fastest_measured(counted_models):
    factory = FakeEngines(runner_for(), [])
    result = invoke(["run", "-", "--max-tokens", "2"], input="a\nb\n", factory=factory)
    assert result.exit_code == 0, result.stderr
    assert factory.slot_choices == [(None, 16)] and factory.engines[0].config.n_parallel == 16


def test_supervised_run_with_the_fake_in_the_child_resolves_once(tmp_path, counted_models):
    factory = FakeEngines(runner_for(), [], supervise=True)
    result = invoke(["run", str(_lines(tmp_path, 2)), "--max-tokens", "16", "--n-ctx", "1024", "-q"],
                    factory=factory)
    assert result.exit_code == 0, result.stderr
    (engine,) = factory.engines
    assert isinstance(engine, SupervisedEngine)
    assert engine.config.n_parallel == 2 and engine.slots_reason == "auto: bounded by 2 input lines"
    assert counted_models == [DEFAULT] and factory.slot_choices == [(2, 2)]  # in this process: once each
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["text"] for r in records] == ["line 0!", "line 1!"]  # the child's fake: "<prompt>!"
    assert all(r["error"] is None for r in records)


def test_no_isolate_builds_in_process_with_the_same_settings(tmp_path):
    factory = FakeEngines(runner_for(), [], supervise=True)
    result = invoke(["run", str(_lines(tmp_path, 2)), "--max-tokens", "2", "--no-isolate", "-q",
                     "--n-parallel", "2", "--n-ctx", "256"], factory=factory)
    assert result.exit_code == 0, result.stderr
    (engine,) = factory.engines
    assert isinstance(engine, Engine) and engine.config.n_parallel == 2 and factory.slot_choices == []
