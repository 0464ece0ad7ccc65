"""n_ctx auto's rule (settings/context_sizing.py) over files of mixed lengths, and `run` reading
its INPUT to apply it (jobs/reading/context_fit.py), with a fake tokenizer. No model."""
from __future__ import annotations

import json

from llamabatch import EngineConfig
from llamabatch.jobs.reading.context_fit import fit_context, maybe_long, token_bound
from llamabatch.openai_format.lines import LineParser
from llamabatch.settings.context_sizing import plan_context, request_limit
from llamabatch.params import SamplingParams
from llamabatch.settings.resolved import Resolved

KIB = 1024
GEMMA_CELL = 18 * KIB  # KV bytes of one token, f16, Gemma 3 270M
AMPLE = 12 << 30


def test_every_line_within_a_default_slot_changes_nothing():
    assert plan_context([100, 4096, 3000], 8, 32768, GEMMA_CELL, AMPLE) is None


def test_documents_of_one_length_get_streams_as_large_as_the_longest():
    plan = plan_context([5001] * 8, 8, 32768, GEMMA_CELL, AMPLE)
    assert (plan.n_parallel, plan.per_request, plan.n_ctx, plan.kv_unified) == (8, 5120, 8 * 5120, False)
    assert "5,001 tokens" in plan.reason and "8 slots x 5,120" in plan.reason


def test_mostly_short_lines_and_two_long_ones_share_a_pool_not_eight_long_slots():
    needs = [356] * 200 + [20_100, 20_300]
    plan = plan_context(needs, 8, 32768, GEMMA_CELL, AMPLE)
    assert plan.kv_unified and plan.n_parallel == 8
    # room for the two long ones and six short ones at once: far below 8 x 20,480
    assert 20_100 + 20_300 + 6 * 356 <= plan.n_ctx < 8 * 20_480 / 2
    assert plan.per_request == 32768 or plan.per_request == plan.n_ctx
    assert "pool" in plan.reason


def test_pool_is_never_smaller_than_today_s_default():
    plan = plan_context([100] * 7 + [30_000], 8, 32768, GEMMA_CELL, AMPLE)
    assert plan.kv_unified and plan.n_ctx >= 8 * 4096


def test_a_small_memory_budget_gives_fewer_larger_slots():
    budget = 3 * 5120 * GEMMA_CELL + 1000  # three slots of 5,120 tokens
    plan = plan_context([5001] * 8, 8, 32768, GEMMA_CELL, budget, "max_memory 1GiB less the weights")
    assert (plan.n_parallel, plan.per_request, plan.kv_unified) == (3, 5120, False)
    assert "holds 3 of that size" in plan.reason and "max_memory 1GiB" in plan.reason


def test_a_line_longer_than_the_model_or_the_memory_is_counted_and_left_to_fail_alone():
    plan = plan_context([5001] * 3 + [40_000], 4, 32768, GEMMA_CELL, AMPLE)
    assert plan.too_long == 1 and plan.per_request == 5120 and "1 line can never fit" in plan.reason
    small = plan_context([5001, 9000], 2, 32768, GEMMA_CELL, 6000 * GEMMA_CELL)
    assert small.too_long == 1 and small.per_request == 5120


def test_deterministic_mode_keeps_a_stream_per_slot():
    needs = [356] * 200 + [20_100, 20_300]
    plan = plan_context(needs, 8, 32768, GEMMA_CELL, AMPLE, pool_allowed=False)
    assert not plan.kv_unified and plan.per_request == 20_480


def test_a_model_trained_for_less_than_a_default_slot_still_gets_one():
    assert request_limit(2048) == 4096 and request_limit(None) == 4096 and request_limit(32768) == 32768
    assert plan_context([5000], 1, 2048, GEMMA_CELL, AMPLE) is None  # nothing fits past 4,096: unchanged


def test_the_byte_bound_tokenizes_only_lines_that_might_pass_a_default_slot():
    parser = LineParser(SamplingParams(max_tokens=16))
    lines = [parser.parse(json.dumps({"prompt": "short"}), 1),
             parser.parse(json.dumps({"prompt": "x" * 5000}), 2),
             parser.parse(json.dumps({"prompt": "y", "max_tokens": 5000}), 3),
             parser.parse(json.dumps({"messages": [{"role": "user", "content": "z" * 3700}]}), 4),
             parser.parse("{not json", 5)]
    short, candidates = maybe_long(lines)
    assert [c.line_no for c in candidates] == [2, 3, 4]
    assert short == [token_bound(lines[0]) + 16]


class FakeTokenizer:
    """One token per character, chat rendered as its contents: what context_fit asks of an engine."""

    def __init__(self):
        self.closed = False
        self.seen: list[str] = []

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        self.seen.append(text)
        return [1] * len(text)

    def render_chat(self, messages):
        return "".join(m["content"] for m in messages)

    def close(self):
        self.closed = True


def fit(tmp_path, lines, config: EngineConfig, facts=(32768, GEMMA_CELL, AMPLE, "ample")):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tokenizer = FakeTokenizer()
    prepared = []

    def prepare(resolved, n_lines):
        prepared.append(n_lines)
        if resolved.engine.n_parallel != "auto":
            return resolved
        return resolved.replace(engine=resolved.engine.replace(n_parallel=min(4, n_lines)))

    resolved = Resolved(engine=config, sampling=SamplingParams(max_tokens=8))
    out, plan, long_lines = fit_context(resolved, str(path), LineParser(SamplingParams(max_tokens=8)), prepare=prepare,
                            open_tokenizer=lambda r: tokenizer, model_facts=lambda r: facts)
    fit.long_lines = long_lines
    return out, plan, tokenizer, prepared


def test_run_sizes_its_engine_from_the_file(tmp_path):
    lines = [{"prompt": "a" * 6000, "max_tokens": 8} for _ in range(4)] + [{"prompt": "short"}]
    out, plan, tokenizer, prepared = fit(tmp_path, lines, EngineConfig(model="m.gguf", n_parallel="auto"))
    assert prepared == [5] and tokenizer.closed and len(tokenizer.seen) == 4  # the short line was not tokenized
    assert (out.engine.n_parallel, out.engine.n_ctx, out.engine.kv_unified) == (4, 4 * 6144, False)
    assert "6,008 tokens" in out.slots_reason
    assert fit.long_lines == {1, 2, 3, 4}


def test_an_explicit_n_ctx_is_honoured_exactly(tmp_path):
    config = EngineConfig(model="m.gguf", n_parallel=2, n_ctx=4096)
    out, plan, tokenizer, prepared = fit(tmp_path, [{"prompt": "a" * 6000}], config)
    assert plan is None and out.engine is config and prepared == [] and tokenizer.seen == []


def test_a_file_of_short_lines_opens_no_tokenizer_and_says_why_in_the_header(tmp_path):
    out, plan, tokenizer, prepared = fit(tmp_path, [{"prompt": "hello"}] * 5, EngineConfig(model="m.gguf"))
    assert plan is None and tokenizer.seen == [] and prepared == []
    assert out.engine.n_ctx is None and "4,096 tokens a slot hold every line" in out.slots_reason


def test_n_ctx_auto_is_read_from_every_layer():
    assert EngineConfig(n_ctx="auto").validate().n_ctx is None
    assert EngineConfig.from_dict({"n_ctx": "auto"}).n_ctx is None
    assert EngineConfig.from_dict({"n_ctx": "8192"}).n_ctx == 8192
    from llamabatch.settings.layers import merge

    assert merge({}, "run", environ={"LLAMABATCH_N_CTX": "auto"}).engine.n_ctx is None
    assert merge({"n_ctx": "16384"}, "run", environ={}).engine.n_ctx == 16384


def test_a_file_whose_lines_all_fit_a_default_slot_keeps_today_s_engine_exactly(tmp_path):
    # benchmarks/vs_llama_server.py's workload (c): distinct prompts of 95-1,430 tokens, 32 out.
    # Each fits 4,096: the engine is the one of before auto, field for field (long distinct
    # prompts: a stream per slot, settings/kv_layout.py)
    lines = [{"prompt": f"{i}: " + "w " * n, "max_tokens": 32} for i, n in enumerate((95, 700, 1430) * 8)]
    config = EngineConfig(model="m.gguf", n_parallel=8)
    out, plan, tokenizer, prepared = fit(tmp_path, lines, config)
    assert plan is None and fit.long_lines == frozenset()
    assert out.engine == config and out.engine.n_ctx is None and not out.engine.kv_unified
    assert out.layout_reason.startswith("KV layout: a stream per slot")


def test_an_explicit_n_parallel_is_kept_exactly():
    budget = 3 * 5120 * GEMMA_CELL + 1000
    plan = plan_context([5001] * 2 + [6000], 8, 32768, GEMMA_CELL, budget, slots_fixed=True)
    # 8 slots kept; the memory allowed holds less than 8 default slots: nothing changes
    assert plan is None
    plan = plan_context([4300] * 8 + [5001], 4, 32768, GEMMA_CELL, 4 * 4500 * GEMMA_CELL, slots_fixed=True)
    # streams of 5,120 do not fit the memory: 4 smaller ones (4,352 each), not fewer slots
    assert (plan.n_parallel, plan.per_request, plan.kv_unified, plan.too_long) == (4, 4352, False, 1)
    assert plan_context([5001], 8, 32768, GEMMA_CELL, AMPLE, slots_fixed=True).n_parallel == 8
