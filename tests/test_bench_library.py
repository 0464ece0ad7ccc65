"""llamabatch.bench without the command line: the levels planned and run over engines the
caller opens (the scripted fake runner here), progress through callbacks, the --json document,
and bad values as InvalidRequest before any engine opens."""
from __future__ import annotations

import json

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.bench import embed as embed_bench
from llamabatch.bench.checks import check_own_options, load_recorded
from llamabatch.bench.document import generation_document, write_json
from llamabatch.bench.generation import plan_generation, run_generation
from llamabatch.errors import InvalidRequest, ReportFileError
from llamabatch.settings.resolved import Resolved

from fake_runner import FakeRunner


def resolved(**engine) -> Resolved:
    return Resolved(EngineConfig(**{"n_ctx": 512, **engine}).validate(), SamplingParams(temperature=0).validate())


class Opener:
    """open_engine for the library: an Engine over the fake runner, shaped like the settings."""

    def __init__(self):
        self.engines: list[Engine] = []
        self.runners: list[FakeRunner] = []

    def __call__(self, settings: Resolved) -> Engine:
        config = settings.engine
        runner = FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, n_batch=config.n_batch)
        engine = Engine(config, runner=runner, default_params=settings.sampling)
        self.runners.append(runner)
        self.engines.append(engine)
        return engine


def test_levels_run_on_the_callers_engines_with_progress_through_callbacks():
    settings = resolved(n_parallel=4)
    plan = plan_generation(settings, [1, 3], pp=8, tg=4, requests=None, prompt_lines=None, baseline=False)
    assert plan.counts == [1, 3] and [c.n_parallel for c in plan.configs] == [1, 3]
    phases: list[str] = []
    advanced: list[int] = []
    opener = Opener()
    run = run_generation(plan, settings, opener, phase=phases.append, advance=advanced.append)
    assert phases == ["B=1", "B=3"]
    assert sum(advanced) == plan.tokens_to_generate() == (1 + 3) * 4
    assert [e.config.n_parallel for e in opener.engines] == [1, 3]
    assert [r.close_calls for r in opener.runners] == [1, 1]  # each level's engine is closed after it
    assert [level["n_parallel"] for level in run.figures] == [1, 3] and run.errors == []
    assert run.prompts and all(len(p) == 8 for p in run.prompts)

    document = generation_document(plan, run, settings.sampling, requests=None, prompts=None)
    assert document["settings"]["parallel"] == [1, 3] and document["levels"] is run.figures
    assert "default_levels" not in document and document["baseline"] is None


def test_without_an_opener_the_levels_open_their_engines_through_llamabatch_engines(monkeypatch):
    import llamabatch.engines

    opener = Opener()
    monkeypatch.setattr(llamabatch.engines, "open_engine", opener)
    settings = resolved(n_parallel=2)
    run = run_generation(plan_generation(settings, [2], 4, 2, None, None, False), settings)
    assert [e.config.n_parallel for e in opener.engines] == [2] and len(run.figures) == 1
    figures, _ = embed_bench.run_levels(settings, embed_bench.plan_configs(settings, [16]), 2, 4, None)
    assert len(opener.engines) == 2 and figures[0]["inputs"] == 2


def test_deterministic_runs_each_level_twice_default_engine_first():
    settings = resolved(n_parallel=2, deterministic=True)
    plan = plan_generation(settings, [2], pp=4, tg=2, requests=None, prompt_lines=None, baseline=False)
    phases: list[str] = []
    run = run_generation(plan, settings, Opener(), phase=phases.append)
    assert phases == ["B=2", "B=2 deterministic"]
    assert len(run.figures) == len(run.default_figures) == 1
    assert "default_levels" in generation_document(plan, run, settings.sampling, None, None)


def test_what_does_not_fit_is_refused_before_any_engine_opens():
    with pytest.raises(InvalidRequest, match=r"--pp 500 \+ --tg 64 = 564 tokens does not fit a slot of 256"):
        plan_generation(resolved(n_ctx=512, n_parallel=2), [1, 2], 500, 64, None, None, False)
    with pytest.raises(InvalidRequest, match="--tg must be an integer >= 1, got 0"):
        check_own_options("1,2", 8, 0, None, None, None, 0)
    with pytest.raises(InvalidRequest, match="--embed-batch must be a comma-separated list"):
        embed_bench.parse_batches("64,x")


def test_prompt_lines_that_do_not_fit_a_slot_name_their_line():
    settings = resolved(n_ctx=64, n_parallel=1)
    lines = [(1, "short"), (3, "x " * 200)]
    plan = plan_generation(settings, [1], pp=8, tg=4, requests=2, prompt_lines=lines, baseline=False)
    with pytest.raises(InvalidRequest, match="--prompts line 3: .* prompt tokens \\+ --tg 4 do not fit a slot"):
        run_generation(plan, settings, Opener())


def test_embed_levels_run_one_engine_per_batch_size():
    settings = resolved()
    configs = embed_bench.plan_configs(settings, [16, 32])
    phases: list[str] = []
    done: list[int] = []
    opener = Opener()
    figures, model = embed_bench.run_levels(settings, configs, 5, 8, None, opener, phase=phases.append,
                                            advance=done.append)
    assert phases == ["batch 16", "batch 32"] and sum(done) == 10
    assert [f["n_batch"] for f in figures] == [16, 32] and all(f["inputs"] == 5 for f in figures)
    assert [r.close_calls for r in opener.runners] == [1, 1] and "slot_ctx" in model


def test_report_files_that_cannot_be_written_are_typed_errors(tmp_path):
    write_json(str(tmp_path / "ok.json"), {"levels": []})
    assert json.loads((tmp_path / "ok.json").read_text()) == {"levels": []}
    with pytest.raises(ReportFileError, match=r"^--json .*missing/b.json: "):
        write_json(str(tmp_path / "missing" / "b.json"), {})
    with pytest.raises(InvalidRequest, match="--json and --from-json together"):
        load_recorded(str(tmp_path / "ok.json"), "x.json", None, 0, False)


def test_other_kv_types_run_each_level_twice_f16_first_and_record_both():
    settings = resolved(n_parallel=2, cache_type_k="q8_0", cache_type_v="q8_0")
    plan = plan_generation(settings, [2], pp=4, tg=2, requests=None, prompt_lines=None, baseline=False)
    phases: list[str] = []
    opener = Opener()
    run = run_generation(plan, settings, opener, phase=phases.append)
    assert phases == ["B=2 KV f16/f16", "B=2 KV q8_0/q8_0"]
    assert [(e.config.cache_type_k, e.config.cache_type_v) for e in opener.engines] == [("f16", "f16"),
                                                                                        ("q8_0", "q8_0")]
    assert [lv["kv"]["cache_types"] for lv in run.f16_figures + run.figures] == ["f16/f16", "q8_0/q8_0"]
    assert plan.tokens_to_generate() == 2 * 2 * 2
    document = generation_document(plan, run, settings.sampling, None, None)
    assert document["f16_levels"] is run.f16_figures and document["settings"]["cache_type_k"] == "q8_0"
    assert "f16_levels" not in generation_document(*_f16_run(), settings.sampling, None, None)


def _f16_run():
    settings = resolved(n_parallel=2)
    plan = plan_generation(settings, [2], pp=4, tg=2, requests=None, prompt_lines=None, baseline=False)
    return plan, run_generation(plan, settings, Opener())
