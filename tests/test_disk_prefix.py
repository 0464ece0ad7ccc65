"""The engine and the disk prefix store, on the scripted fake runner and a real store folder:
what gets saved (exactly a prefix two requests share, once), what gets restored (the longest
entry that starts the prompt), and that a request answers the same either way."""
from __future__ import annotations

import os

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.prefixes.disk_prefix import SAVE_MIN_TOKENS

from fake_runner import FakeRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
WAIT = 10
INSTRUCTION = "Label the sentiment of the review below as one of: good, bad, mixed. " * 3  # > SAVE_MIN_TOKENS
assert len(INSTRUCTION) > SAVE_MIN_TOKENS


def reply_of(prompt: str) -> str:
    return prompt[-3:].upper()  # depends on the whole prompt having reached the slot's KV


def make_engine(runner: FakeRunner, store: str | None, **config) -> Engine:
    cfg = dict(n_parallel=runner.n_slots, n_batch=128, chunk_size=64, share_prefix_min=8, prefix_store=store)
    cfg.update(config)
    runner.n_batch = cfg["n_batch"]
    return Engine(EngineConfig(**cfg), runner=runner, default_params=GREEDY)


def run_items(store, items, **runner_kw):
    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=reply_of, **runner_kw)
    with make_engine(runner, store) as engine:
        with engine.hold():  # all submitted before the first tick
            handles = [engine.submit(INSTRUCTION + item) for item in items]
        results = [h.result(WAIT) for h in handles]
    assert runner.violations == []
    return runner, results


def test_a_shared_instruction_is_saved_once_as_exactly_the_shared_part(tmp_path):
    runner, results = run_items(str(tmp_path), ["cat", "dog", "eel"])
    assert [r.text for r in results] == ["CAT", "DOG", "EEL"]
    # the first prompt's prefill was cut where the prompts part ways, and that slot saved there
    assert runner.snapshots == [(0, len(INSTRUCTION))]
    cut = [c for p in runner.plans for c in p.plan.chunks if c.slot == 0 and not c.is_decode]
    assert any(c.start_pos + len(c.tokens) == len(INSTRUCTION) for c in cut)
    assert all(r.usage.restored_tokens == 0 for r in results)  # nothing on disk before this run
    entries = list(tmp_path.rglob("*.kv"))
    assert len(entries) == 1


def test_a_later_engine_restores_the_instruction_instead_of_evaluating_it(tmp_path):
    _, first = run_items(str(tmp_path), ["cat", "dog"])
    runner, again = run_items(str(tmp_path), ["cat", "dog", "eel"])
    assert [r.text for r in again] == ["CAT", "DOG", "EEL"]
    assert [r.text for r in again[:2]] == [r.text for r in first]
    # one restore (the first request); the others fork it from that slot as before
    assert [(n, ok) for _, n, ok in runner.restores] == [(len(INSTRUCTION), True)]
    assert again[0].usage.restored_tokens == again[0].usage.cached_tokens == len(INSTRUCTION)
    evaluated = sum(p.plan.prefill_tokens for p in runner.plans)
    assert evaluated == 3 * len("cat")  # the instruction itself is never evaluated
    assert runner.snapshots == []  # already in the store: not saved again


def test_a_restore_llama_cpp_refuses_falls_back_to_evaluating_the_prompt(tmp_path):
    run_items(str(tmp_path), ["cat", "dog"])
    runner, results = run_items(str(tmp_path), ["cat"], restore_ok=lambda slot: False)
    assert [r.text for r in results] == ["CAT"]
    assert [ok for _, _, ok in runner.restores] == [False]
    assert results[0].usage.cached_tokens == 0 and results[0].usage.restored_tokens == 0
    assert sum(p.plan.prefill_tokens for p in runner.plans) == len(INSTRUCTION + "cat")


def test_a_prefix_shorter_than_the_minimum_is_not_saved(tmp_path):
    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=reply_of)
    short = "x" * (SAVE_MIN_TOKENS // 2)
    with make_engine(runner, str(tmp_path)) as engine:
        with engine.hold():
            handles = [engine.submit(short + item) for item in ("cat", "dog")]
        assert [h.result(WAIT).text for h in handles] == ["CAT", "DOG"]
    assert runner.snapshots == [] and list(tmp_path.rglob("*.kv")) == []


def test_save_prefix_seeds_the_store_for_a_later_engine(tmp_path):
    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=reply_of)
    with make_engine(runner, str(tmp_path)) as engine:
        saved = engine.save_prefix(INSTRUCTION)
    assert saved.ok and saved.stored_prefix is not None
    assert (tmp_path / saved.stored_prefix).is_file()
    runner, results = run_items(str(tmp_path), ["cat"])
    # the entry holds the whole instruction; the prompt's own last tokens are evaluated
    assert results[0].text == "CAT" and results[0].usage.restored_tokens == len(INSTRUCTION)


@pytest.mark.parametrize("why", ["store off", "runner cannot", "no cache_prompt"])
def test_no_store_is_used_where_it_is_off_or_cannot_be_exact(tmp_path, why):
    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=reply_of, can_store=why != "runner cannot")
    config = {"cache_prompt": why != "no cache_prompt"}
    with make_engine(runner, None if why == "store off" else str(tmp_path), **config) as engine:
        assert engine.disk is None
        with engine.hold():
            handles = [engine.submit(INSTRUCTION + item) for item in ("cat", "dog")]
        assert [h.result(WAIT).text for h in handles] == ["CAT", "DOG"]
    assert runner.snapshots == [] and runner.restores == [] and list(tmp_path.rglob("*.kv")) == []


def test_every_request_gets_one_result_when_cancelled_while_its_slot_is_restored(tmp_path):
    run_items(str(tmp_path), ["cat", "dog"])
    holder = {}

    def hook(call, plan):
        if plan.restores and "handle" in holder:
            holder["handle"].cancel()  # lands at the next tick: after the restore has run

    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=reply_of, hook=hook)
    with make_engine(runner, str(tmp_path)) as engine:
        with engine.hold():
            holder["handle"] = engine.submit(INSTRUCTION + "cat")
        first = holder["handle"].result(WAIT)
        later = engine.submit(INSTRUCTION + "dog").result(WAIT)  # reuses what the restore left in the slot
    assert first.finish_reason == "cancelled"
    assert later.text == "DOG" and later.usage.cached_tokens >= len(INSTRUCTION)
    assert runner.violations == []


def test_a_request_that_forks_a_prefix_another_slot_went_past_saves_the_copy(tmp_path):
    """The first prompt was evaluated whole before the second arrived: the second forks the
    shared part, sits one tick out while llama_decode performs the copy, and its slot (holding
    exactly the shared part) is saved."""
    # 40 tokens of 10 ms each: the first is still generating when the second arrives
    runner = FakeRunner(n_slots=2, slot_ctx=600, reply=lambda p: "x" * 40 if p.endswith("cat") else reply_of(p),
                        step_delay=0.01)
    with make_engine(runner, str(tmp_path)) as engine:
        first = engine.submit(INSTRUCTION + "cat", GREEDY.replace(max_tokens=40))
        next(iter(first))  # its first token: the whole prompt is in slot 0, which keeps generating
        second = engine.submit(INSTRUCTION + "dog")
        assert second.result(WAIT).text == "DOG" and first.result(WAIT).ok
    assert runner.violations == []
    assert [f[2] for f in runner.forks] == [len(INSTRUCTION)]
    assert runner.snapshots == [(runner.forks[0][1], len(INSTRUCTION))]
    assert second.result().usage.cached_tokens == len(INSTRUCTION)
    assert len(list(tmp_path.rglob("*.kv"))) == 1


def test_a_slot_reusing_its_own_cache_saves_the_shared_part_once(tmp_path):
    """One slot, prompts one after the other (as in chat or a run with one slot): the second
    reuses the first's instruction from the slot's own cache, trimmed to exactly it, and saves it."""
    runner = FakeRunner(n_slots=1, slot_ctx=600, reply=reply_of)
    with make_engine(runner, str(tmp_path)) as engine:
        texts = [engine.submit(INSTRUCTION + item).result(WAIT).text for item in ("cat", "dog", "eel")]
    assert texts == ["CAT", "DOG", "EEL"] and runner.violations == []
    assert runner.snapshots == [(0, len(INSTRUCTION))]  # once: the third finds it in the store
    assert len(list(tmp_path.rglob("*.kv"))) == 1


# -- a store folder that can never work ---------------------------------------------------------


def cli_run(tmp_path, monkeypatch, store: str):
    """`run -` of two lines on the fake runner with --prefix-store STORE."""
    from cli_harness import invoke, runner_for

    fake = tmp_path / "fake.gguf"  # the fake runner stands in for a model file of its own
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setenv("LLAMABATCH_MODEL", str(fake))
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))
    return invoke(["run", "-", "--prefix-store", store, "--n-parallel", "2", "--max-tokens", "2"],
                  input="one\ntwo\n", runner=runner_for())


@pytest.mark.parametrize("store, why", [
    ("file", "is a file, not a folder"),
    ("/dev/null", "/dev/null is a character device, not a folder"),
    ("file/sub", "is a file, not a folder"),
])
def test_a_store_folder_that_cannot_work_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, store, why):
    (tmp_path / "file").write_text("notes\n")
    monkeypatch.chdir(tmp_path)
    result = cli_run(tmp_path, monkeypatch, store)
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2  # both lines answered
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [f"llamabatch: warning: prefix store {store} can't be used "
                        f"({os.path.abspath('file') + ' ' + why if store != '/dev/null' else why}): running without it"]
    assert result.engines[0].disk is None and result.engines[0].config.prefix_store is None
    assert (tmp_path / "file").read_text() == "notes\n"


def test_a_store_folder_not_made_yet_is_no_warning(tmp_path, monkeypatch):
    result = cli_run(tmp_path, monkeypatch, str(tmp_path / "new" / "store"))
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr and result.engines[0].disk is not None
