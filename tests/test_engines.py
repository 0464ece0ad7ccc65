"""llamabatch.engines: the one place engines are built, over the scripted fake runner.

open_engine takes resolved settings or an EngineConfig, decides the model and n_parallel
"auto" once, and builds an Engine or (isolated) a SupervisedEngine through the factory it is
given; runners registered by name reach the supervised child; the core engine takes only
decided settings.
"""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, InvalidRequest, ModelLoadError, SamplingParams
from llamabatch.core.engine import EngineCore
from llamabatch.engines import EngineFactory, RunnerChoice, open_engine, register_runner
from llamabatch.in_process.runners import make_runner
from llamabatch.llama.autoslots import CANDIDATES
from llamabatch.settings.ready import settings_for
from llamabatch.settings.slots import most_slots
from llamabatch.supervised import SupervisedEngine

import supervised_child_runner
from child_tools import child_env, fake_gguf
from cli_harness import FakeEngines, runner_for
from fake_runner import FakeRunner

GREEDY = SamplingParams(max_tokens=4, temperature=0)


class ChildFakeFactory(EngineFactory):
    """The real factory; every engine runs the registered fake (in this process or the child)."""

    def runner_choice(self):
        return supervised_child_runner.choice("fake")

    def child_environment(self):
        return child_env()


def test_open_engine_decides_auto_slots_once_and_builds_in_process(tmp_path):
    factory = FakeEngines(runner_for(), [])
    spec = EngineConfig(model=fake_gguf(tmp_path), n_parallel="auto", n_ctx=2048)
    with open_engine(spec, GREEDY, factory=factory, max_slots=3) as engine:
        assert isinstance(engine, Engine) and engine.config.n_parallel == 3
        assert engine.slots_reason == "auto: bounded by 3 input lines"
        assert engine.generate(["hi"])[0].text == "hi!"
    assert factory.slot_choices == [(3, 3)]


def test_open_engine_refuses_a_file_that_is_not_a_model_before_measuring(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    factory = FakeEngines(runner_for(), [])
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        open_engine(EngineConfig(model=str(bad), n_parallel="auto"), factory=factory)
    assert factory.slot_choices == [] and factory.engines == []


def test_an_unusable_prefix_store_is_one_notice_and_the_engine_runs_without_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    notices: list[str] = []
    spec = EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, prefix_store=str(blocker))
    with open_engine(spec, factory=FakeEngines(runner_for(), []), on_notice=notices.append) as engine:
        assert engine.config.prefix_store is None and engine.disk is None
        assert engine.on_notice == notices.append
    assert len(notices) == 1 and notices[0].startswith(f"warning: prefix store {blocker} can't be used (")
    assert notices[0].endswith("): running without it")


def test_more_threads_than_the_cpus_allowed_run_as_given_with_one_notice(tmp_path, monkeypatch):
    monkeypatch.setattr("llamabatch.kernel_paths.resources.usable_cpus", lambda: 2)
    notices: list[str] = []
    for threads in (None, 2, 3):
        spec = EngineConfig(model=fake_gguf(tmp_path), n_parallel=1, threads=threads)
        with open_engine(spec, factory=FakeEngines(runner_for(), []), on_notice=notices.append) as engine:
            assert engine.config.threads == threads
    assert notices == ["warning: threads 3 is more than the 2 CPU(s) this process may use; llama.cpp's "
                       "threads then wait for each other: leave --threads unset to use 2"]


def test_isolated_engines_run_the_registered_runner_in_the_child(tmp_path):
    spec = settings_for(EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, n_ctx=512), GREEDY)
    with open_engine(spec, factory=ChildFakeFactory(), isolated=True, watchdog_s=0) as engine:
        assert isinstance(engine, SupervisedEngine)
        assert [r.text for r in engine.generate(["one", "two"])] == ["one!", "two!"]


def test_registered_runners_by_name_and_what_an_unknown_one_says():
    config = EngineConfig(n_parallel=2, n_ctx=256)
    register_runner("test-engines-two-slots", lambda c: FakeRunner(n_slots=2, slot_ctx=64))
    assert make_runner(RunnerChoice("test-engines-two-slots", "no_such_module"), config).n_slots == 2
    assert isinstance(make_runner(supervised_child_runner.choice("slow"), config), FakeRunner)
    with pytest.raises(ModelLoadError, match="cannot import 'no_such_module_here'"):
        make_runner(RunnerChoice("nobody", "no_such_module_here"), config)
    with pytest.raises(ModelLoadError, match="'supervised_child_runner' registers no runner of that name"):
        make_runner(RunnerChoice("nobody", "supervised_child_runner"), config)


def test_the_public_engine_takes_a_runner_and_its_slots_for_auto():
    runner = FakeRunner(n_slots=3, slot_ctx=64)
    with Engine(EngineConfig(n_parallel="auto"), runner=runner, default_params=GREEDY) as engine:
        assert engine.config.n_parallel == 3 and engine.model_name == "fake-model"
        assert engine.generate([[{"role": "user", "content": "hi"}]])[0].ok  # chat templates handed in


def test_the_core_engine_takes_only_decided_settings():
    runner = FakeRunner(n_slots=2, slot_ctx=64)
    with pytest.raises(ValueError, match='n_parallel "auto" is decided before an engine starts'):
        EngineCore(EngineConfig(n_parallel="auto"), runner=runner)
    with EngineCore(EngineConfig(n_parallel=2), runner=runner, default_params=GREEDY) as engine:
        assert engine.generate(["plain"], GREEDY.replace(max_tokens=16))[0].text == "plain!"
        chat = engine.generate([[{"role": "user", "content": "hi"}]])[0]
        assert chat.finish_reason == "error" and "chat messages need a chat template" in chat.error
        assert engine.disk is None


def test_most_slots_is_the_count_or_the_largest_auto_may_choose():
    assert most_slots(EngineConfig(n_parallel=6)) == 6
    assert most_slots(EngineConfig(n_parallel="auto")) == max(CANDIDATES)


def test_open_pool_without_ray_says_how_to_install_it(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kw):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'", name="ray")
        return real_import(name, *args, **kw)

    from llamabatch.engines import open_pool

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(InvalidRequest, match=r"needs Ray, which is not installed: pip install 'llamabatch\[ray\]'"):
        open_pool(EngineConfig(n_parallel=2), address="127.0.0.1:1")


def test_the_kv_cells_the_child_holds_reach_the_parents_stats(tmp_path):
    spec = EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, n_ctx=512)
    with open_engine(spec, GREEDY, factory=ChildFakeFactory(), isolated=True, watchdog_s=0) as engine:
        assert engine.stats().kv_cells_used == 0
        (result,) = engine.generate(["question"])
        stats = engine.stats()
    # the slot keeps the prompt and the answer (for the prefix cache), all but tokens never evaluated
    assert result.usage.prompt_tokens <= stats.kv_cells_used <= result.usage.prompt_tokens + result.usage.completion_tokens
