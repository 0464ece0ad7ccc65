"""`run` chooses its KV layout from its file (settings/kv_layout.py) when the user chose none:
one shared cache when the lines hold few tokens of their own (the prompt beyond what lines share,
plus max_tokens), a stream per slot when they hold many; an explicit --kv-unified /
--no-kv-unified and deterministic mode are honoured exactly, and the run header says which
layout and why."""
from __future__ import annotations

import json

import pytest

from llamabatch.settings.kv_layout import BYTES_PER_TOKEN, OWN_TOKENS, choose_layout, own_parts, own_tokens, prompt_text

from cli_harness import invoke, runner_for

INSTRUCTION = "Label the review as positive or negative. " * 40  # a long shared instruction


def test_own_parts_leave_out_what_lines_share():
    texts = [INSTRUCTION + "great film", INSTRUCTION + "dull plot", "alone"]
    assert own_parts(texts) == [len("great film"), len("dull plot"), len("alone")]


def test_own_tokens_are_the_own_prompt_part_as_tokens_plus_the_answer():
    lines = [(INSTRUCTION + "great film", 16), (INSTRUCTION + "dull plot", 100)]
    assert own_tokens(lines) == [-(-len("great film") // BYTES_PER_TOKEN) + 16,
                                 -(-len("dull plot") // BYTES_PER_TOKEN) + 100]


def test_short_lines_and_shared_instructions_share_one_cache():
    assert choose_layout([(f"question {i}?", 64) for i in range(20)])[0] is True
    unified, reason = choose_layout([(INSTRUCTION + f"review {i}", 16) for i in range(20)])
    assert unified and reason.startswith("KV layout: one cache shared by the slots")


def test_long_distinct_documents_get_a_stream_per_slot():
    docs = [(f"document {i}: " + ("word%d " % i) * (OWN_TOKENS * BYTES_PER_TOKEN // 6), 32) for i in range(10)]
    unified, reason = choose_layout(docs)
    assert not unified and reason.startswith("KV layout: a stream per slot")


def test_long_answers_get_a_stream_per_slot_though_the_prompts_are_short():
    assert choose_layout([(f"question {i}?", OWN_TOKENS - 10) for i in range(20)])[0] is True
    unified, reason = choose_layout([(f"question {i}?", OWN_TOKENS + 10) for i in range(20)])
    assert not unified and "plus max_tokens" in reason


def test_chats_sharing_a_system_turn_compare_as_text():
    system = {"role": "system", "content": INSTRUCTION}
    texts = [prompt_text([system, {"role": "user", "content": f"q{i}"}]) for i in range(5)]
    assert max(own_parts(texts)) < 40
    assert choose_layout([]) is None


def write(tmp_path, prompts) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": p, "max_tokens": 4}) + "\n" for i, p in enumerate(prompts)))
    return str(path)


@pytest.mark.parametrize("flag, unified", [([], True), (["--no-kv-unified"], False), (["--kv-unified"], True)])
def test_run_chooses_unless_told(tmp_path, flag, unified):
    done = invoke(["run", write(tmp_path, [f"q{i}" for i in range(6)]), "-o", str(tmp_path / "o.jsonl"), *flag],
                  runner=runner_for())
    assert done.exit_code == 0, done.stderr
    assert done.engines[0].config.kv_unified is unified
    assert ("KV layout: one cache shared by the slots" in done.stderr) is (flag == [])


def test_run_gives_long_documents_a_stream_per_slot_and_says_so(tmp_path):
    docs = [f"doc {i} " + ("w%d " % i) * 600 for i in range(4)]
    done = invoke(["run", write(tmp_path, docs), "-o", str(tmp_path / "o.jsonl")], runner=runner_for())
    assert done.exit_code == 0, done.stderr
    assert done.engines[0].config.kv_unified is False and "KV layout: a stream per slot" in done.stderr


def test_deterministic_mode_keeps_a_stream_per_slot(tmp_path):
    done = invoke(["run", write(tmp_path, ["a", "b"]), "-o", str(tmp_path / "o.jsonl"), "--deterministic"],
                  runner=runner_for())
    assert done.exit_code == 0, done.stderr
    assert done.engines[0].config.kv_unified is False and "KV layout" not in done.stderr


def test_the_dry_run_reports_the_layout_the_run_would_choose(tmp_path):
    done = invoke(["run", write(tmp_path, [f"q{i}" for i in range(6)]), "--dry-run", "--json"], runner=runner_for())
    assert done.exit_code == 0, done.stderr
    estimate = json.loads(done.stdout)["slots"]
    assert estimate["kv_unified"] is True and "KV layout: one cache shared" in estimate["context_reason"]
