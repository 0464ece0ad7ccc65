"""`run --dry-run` with n_ctx auto: the estimate reports the context the run would
choose (settings/context_sizing.plan_context over every line's need) and flags only the lines
that can never fit. On the scripted fake runner (one token per character); the fake model
file has no GGUF header, so the model's facts are given by the tests where they matter."""
from __future__ import annotations

import json

import pytest

from test_run_cli import llamabatch_run, write_lines

from llamabatch.jobs.estimates import estimate

QUICK = ["--max-tokens", "4", "--temperature", "0"]
# what a set slot's overflow says would help, as the engine says it in a run (core/overflow_words.py)
SLOT_HELPS = ("(n_ctx / n_parallel), and at least one must be left for the answer; raise --n-ctx, or --kv-unified lets "
              "one request take up to the model's context from a pool the slots share (`run` sizes this from its file "
              "with --n-ctx auto, the default)")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))  # no calibration: auto is not calibrated
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setenv("LLAMABATCH_MODEL", str(fake))


def given_facts(monkeypatch, model_ctx=32768, per_token=1000, budget=None, text="the KV memory allowed"):
    """The model's facts as settings/context_sizing.model_facts would read them from a GGUF."""
    seen = []

    def facts(resolved):
        seen.append(resolved.engine.model)
        return model_ctx, per_token, budget, text

    monkeypatch.setattr(estimate, "model_facts_of", facts)
    return seen


def dry_run(tmp_path, lines, *args: str) -> dict:
    inp = write_lines(tmp_path / "in.jsonl", lines)
    proc = llamabatch_run(str(inp), *args, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def human(tmp_path, *args: str) -> str:
    proc = llamabatch_run(str(tmp_path / "in.jsonl"), *args, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


SHORT = [{"id": "a", "prompt": "A is for"}, {"id": "b", "prompt": "B is for"}]


def test_a_line_past_4096_tokens_within_the_model_context_is_not_flagged_and_the_context_is_named(
        tmp_path, monkeypatch):
    seen = given_facts(monkeypatch)
    r = dry_run(tmp_path, SHORT + [{"id": "doc", "prompt": "x" * 5000}], "--n-parallel", "4", *QUICK)
    assert seen and seen[0].endswith("fake.gguf")  # the resolved model's facts
    assert (r["valid"], r["invalid"], r["invalid_by_code"], r["first_errors"]) == (3, 0, {}, [])
    assert r["prompt_tokens"]["max"] == 5000
    assert r["max_output_tokens"] == 3 * 4
    # needs 5004, 12 and 12: three slots of 5,120 (rounded) cost no more than 1.25 pools of 3 x 4,096
    s = r["slots"]
    assert (s["n_parallel"], s["slot_ctx"], s["n_ctx"], s["kv_unified"]) == (3, 5120, 3 * 5120, False)
    assert s["context_reason"].startswith("n_ctx auto: 3 slots x 5,120 tokens: the longest line needs 5,004")
    out = human(tmp_path, "--n-parallel", "4", *QUICK)
    assert "slots          3 x 5120 tokens (--n-parallel)" in out
    assert "context        n_ctx auto: 3 slots x 5,120 tokens" in out


def test_a_line_over_the_model_context_is_flagged_with_the_numbers_and_what_would_help(tmp_path, monkeypatch):
    given_facts(monkeypatch, model_ctx=8192)
    lines = SHORT + [{"id": "long", "prompt": "y" * 10000}, {"id": "doc", "prompt": "x" * 5000, "max_tokens": 500}]
    r = dry_run(tmp_path, lines, "--n-parallel", "4", *QUICK)
    assert (r["valid"], r["invalid"], r["invalid_by_code"]) == (3, 1, {"context_overflow": 1})
    assert r["first_errors"] == [
        "context_overflow: line 3: prompt has 10,000 tokens but the model's trained context is 8,192 tokens, "
        "prompt and answer together: shorten the prompt, or give --n-ctx (n_ctx / n_parallel tokens a slot; past "
        "the model's trained context its output may degrade)"]  # the engine's words (core/overflow_words.py)
    assert r["prompt_tokens"]["total"] == 8 + 8 + 5000  # the flagged line is not counted
    assert r["max_output_tokens"] == 4 + 4 + 500
    # needs 5,500, 12, 12 (and 10,004, over the model's context): 4 streams of 5,632 cost more than
    # 1.25 pools of 4 x 4,096, so a pool, where one request may take up to the model's context
    s = r["slots"]
    assert (s["n_parallel"], s["slot_ctx"], s["n_ctx"], s["kv_unified"]) == (4, 8192, 16384, True)
    assert "; 1 line can never fit (over 8,192 tokens)" in s["context_reason"]
    assert "invalid        1 context_overflow" in human(tmp_path, "--n-parallel", "4", *QUICK)


def test_the_first_errors_stay_in_line_order_when_the_plan_decides_late(tmp_path, monkeypatch):
    given_facts(monkeypatch, model_ctx=8192)
    lines = [{"id": "long", "prompt": "y" * 9000}, {"foo": 1}, {"id": "a", "prompt": "A"},
             {"id": "a", "prompt": "again"}]
    r = dry_run(tmp_path, lines, "--n-parallel", "4", *QUICK)
    assert [e.split(": line ")[0] for e in r["first_errors"]] == ["context_overflow", "unknown_shape", "duplicate_id"]
    assert r["first_errors"][0].startswith("context_overflow: line 1: prompt has 9,000 tokens")
    assert r["invalid_by_code"] == {"context_overflow": 1, "duplicate_id": 1, "unknown_shape": 1}


def test_a_prompt_that_fits_but_whose_max_tokens_does_not_is_run_clipped(tmp_path, monkeypatch):
    # the need (3,000 + 3,000) passes the model's 4,096: no plan sizes for it, its prompt fits a
    # default slot and generates what the slot leaves
    given_facts(monkeypatch, model_ctx=4096)
    r = dry_run(tmp_path, SHORT + [{"id": "big", "prompt": "z" * 3000, "max_tokens": 3000}],
                "--n-parallel", "2", *QUICK)
    assert (r["valid"], r["invalid"]) == (3, 0)
    assert r["max_output_tokens"] == 4 + 4 + (4096 - 3000)
    assert r["slots"]["slot_ctx"] == 4096
    assert r["slots"]["context_reason"].startswith("n_ctx auto: 4,096 tokens a slot hold every line; KV layout: ")


def test_the_kv_memory_allowed_bounds_the_plan_and_names_the_options(tmp_path, monkeypatch):
    # 6,000,000 bytes at 1,000 a cell: 5,888 cells (whole 256s), one slot of 5,120
    given_facts(monkeypatch, budget=6_000_000, text="half of the 0.0 GiB available")
    lines = [{"id": "doc1", "prompt": "x" * 5000}, {"id": "doc2", "prompt": "w" * 5000},
             {"id": "huge", "prompt": "v" * 7000}]
    r = dry_run(tmp_path, lines, "--n-parallel", "4", *QUICK)
    s = r["slots"]
    assert (s["n_parallel"], s["slot_ctx"], s["n_ctx"]) == (1, 5120, 5120)
    assert s["context_reason"].startswith("n_ctx auto: 1 slot x 5,120 tokens")
    assert r["invalid_by_code"] == {"context_overflow": 1} and r["valid"] == 2
    assert r["first_errors"] == [
        "context_overflow: line 3: prompt has 7,000 tokens but one request may hold 5,120 under n_ctx auto (half "
        "of the 0.0 GiB available holds 5,888 tokens of KV cache): more memory (--max-memory) or a smaller KV "
        "cache (--cache-type-k/--cache-type-v q8_0)"]
    assert r["max_output_tokens"] == 2 * 4


def test_one_long_line_among_short_ones_gets_a_shared_pool(tmp_path, monkeypatch):
    given_facts(monkeypatch)
    lines = SHORT + [{"id": "c", "prompt": "C is for"}, {"id": "doc", "prompt": "x" * 20000}]
    r = dry_run(tmp_path, lines, "--n-parallel", "4", *QUICK)
    s = r["slots"]
    assert s["kv_unified"] is True and s["n_parallel"] == 4
    assert s["n_ctx"] == s["slot_ctx"] == 20224  # 20,004 + 3 x 12, in whole 256s
    assert r["valid"] == 4 and r["max_output_tokens"] == 4 * 4
    assert "slots          4 sharing 20224 tokens, one request up to 20224 (--n-parallel)" in human(
        tmp_path, "--n-parallel", "4", *QUICK)


def test_auto_slots_not_calibrated_plan_for_eight_and_say_so(tmp_path, monkeypatch):
    given_facts(monkeypatch)
    r = dry_run(tmp_path, [{"id": f"d{i}", "prompt": "x" * 5000} for i in range(10)], *QUICK)
    s = r["slots"]
    assert (s["n_parallel"], s["slot_ctx"]) == (8, 5120)
    assert s["source"] == "auto, not calibrated here: the context is planned for up to 8 slots"
    assert r["eta"]["low_s"] is None


def test_without_model_facts_a_default_slot_is_the_most_and_longer_prompts_are_flagged(tmp_path):
    # the fake model file has no GGUF header: nothing is known, one request may hold 4,096
    r = dry_run(tmp_path, SHORT + [{"id": "doc", "prompt": "x" * 5000}], "--n-parallel", "4", *QUICK)
    assert r["invalid_by_code"] == {"context_overflow": 1}
    assert r["first_errors"][0].startswith(
        "context_overflow: line 3: prompt has 5,000 tokens but one request may hold 4,096 under n_ctx auto (as a "
        "slot held before auto; the model's trained context is unknown): shorten the prompt, or give --n-ctx")
    s = r["slots"]
    assert (s["n_parallel"], s["slot_ctx"], s["n_ctx"]) == (4, 4096, 4 * 4096)
    assert s["context_reason"].startswith("n_ctx auto: 4,096 tokens a slot hold every line that can fit; 1 line can never "
                                          "fit; KV layout: ")


def test_an_explicit_n_ctx_keeps_the_fixed_slot_and_reads_no_model_facts(tmp_path, monkeypatch):
    seen = given_facts(monkeypatch)
    r = dry_run(tmp_path, SHORT + [{"id": "long", "prompt": "x" * 300}], "--n-parallel", "4", "--n-ctx", "1024",
                *QUICK)
    assert not seen
    assert r["first_errors"] == [
        "context_overflow: line 3: prompt has 300 tokens but a slot holds 256 " + SLOT_HELPS]
    assert r["slots"] == {"n_parallel": 4, "slot_ctx": 256, "source": "--n-parallel", "n_ctx": 1024,
                          "kv_unified": False, "context_reason": "n_ctx 1,024 as set by --n-ctx"}


def test_stdin_is_not_read_ahead_so_auto_keeps_a_default_slot(tmp_path, monkeypatch):
    seen = given_facts(monkeypatch)
    text = "".join(json.dumps(x) + "\n" for x in SHORT + [{"id": "doc", "prompt": "x" * 5000}])
    proc = llamabatch_run("-", "--n-parallel", "4", *QUICK, "--dry-run", "--json", stdin=text)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert not seen
    assert r["first_errors"] == [
        "context_overflow: line 3: prompt has 5,000 tokens but a slot holds 4,096 " + SLOT_HELPS]
    assert r["slots"]["context_reason"] == ("n_ctx auto: 4,096 tokens a slot (the run sizes the context from a "
                                            "file INPUT only)")


def test_a_prompt_the_plan_left_out_for_its_max_tokens_says_which_max_tokens_would_fit(tmp_path, monkeypatch):
    given_facts(monkeypatch, model_ctx=8192)
    lines = [{"id": "doc", "prompt": "x" * 5000}, {"id": "greedy", "prompt": "g" * 6000, "max_tokens": 4000}]
    r = dry_run(tmp_path, lines, "--n-parallel", "4", *QUICK)
    assert (r["slots"]["slot_ctx"], r["slots"]["kv_unified"]) == (5120, False)
    assert r["first_errors"] == [
        "context_overflow: line 2: prompt has 6,000 tokens but one request may hold 5,120 under n_ctx auto: with "
        "max_tokens 4,000 it needs 10,000, more than the 8,192 one request may ever hold, so the context was not "
        "sized for it; max_tokens 2,192 or less would be"]


def test_a_line_that_can_never_fit_adds_no_prefix_reuse(tmp_path, monkeypatch):
    given_facts(monkeypatch, model_ctx=8192)
    lines = [{"id": "doc", "prompt": "x" * 5000}, {"id": "long", "prompt": "x" * 10000}]
    r = dry_run(tmp_path, lines, "--n-parallel", "4", *QUICK)
    assert r["invalid_by_code"] == {"context_overflow": 1}
    assert r["prefix_reuse_tokens"] == 0  # the long line would have reused the doc's 5,000


def test_the_needs_kept_plan_as_all_of_them_would():
    import random

    from llamabatch.settings.context_sizing import plan_context

    rng = random.Random(50)
    for _ in range(300):
        pending = estimate._Pending()
        needs = [rng.choice([rng.randint(1, 600), rng.randint(3000, 4200), rng.randint(4000, 40000)])
                 for _ in range(rng.randint(1, 40))]
        for need in needs:
            pending.needs[need] += 1
        n_parallel = rng.choice([1, 2, 4, 8, 16])
        facts = rng.choice([(None, None, None), (8192, 1000, None), (32768, 1000, 20_000_000),
                            (131072, 500, 2_000_000), (2048, 100, 10_000_000),
                            (32768, 1000, 2_000_000)])
        for pool_allowed in (True, False):
            assert (plan_context(pending.planned_needs(n_parallel), n_parallel, *facts, pool_allowed=pool_allowed)
                    == plan_context(needs, n_parallel, *facts, pool_allowed=pool_allowed))
