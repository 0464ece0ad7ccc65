"""The scheduler's chunk order: a tick's chunks go to llama.cpp in slot order, so
with a KV stream per slot the rows of consecutive slots share a ubatch (one graph run), and
each tick's telemetry says how many graph runs its batch made. On the fake runner: the same
tokens are evaluated, each once (the runner checks every position), whatever the order."""
from __future__ import annotations

from llamabatch import Engine, EngineConfig, SamplingParams, TickRecord
from llamabatch.kernel_paths.ubatch_split import ubatch_sizes

from fake_runner import FakeRunner


def runs_of(chunks) -> list[tuple[int, int]]:
    return [(c.slot, len(c.tokens)) for c in chunks]


def test_chunks_go_in_slot_order_and_ticks_count_their_graph_runs():
    # replies of different lengths free slots out of order, so later requests are admitted
    # into lower slots than requests still running: admission order is not slot order
    replies = {f"prompt {i} " + "x" * (7 * i % 23): "y" * (5 + 11 * i % 17) for i in range(12)}
    runner = FakeRunner(n_slots=4, slot_ctx=200, n_batch=48, reply=lambda p: replies[p])
    ticks: list[TickRecord] = []
    config = EngineConfig(n_parallel=4, n_batch=48, chunk_size=8, max_queue=0)
    with Engine(config, runner=runner, default_params=SamplingParams(temperature=0, max_tokens=64)) as engine:
        engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
        results = engine.generate(list(replies))
    assert [r.text for r in results] == list(replies.values())
    assert runner.violations == []  # every token at its position, once; no plan over n_batch
    plans = [e.plan for e in runner.plans if e.plan.chunks]
    assert all([c.slot for c in p.chunks] == sorted(c.slot for c in p.chunks) for p in plans)
    assert [t.ubatches for t in ticks] == [len(ubatch_sizes(runs_of(p.chunks), 48, unified=False)) for p in plans]
    # the order mattered: in admission (request id) order the same ticks need more graph runs
    admission = [len(ubatch_sizes(runs_of(sorted(p.chunks, key=lambda c: c.request_id)), 48, unified=False))
                 for p in plans]
    assert sum(admission) > sum(t.ubatches for t in ticks), (admission, [t.ubatches for t in ticks])
    assert all(t.plan_ms >= 0 and t.after_ms >= 0 and t.fill_ms == 0 for t in ticks)


def test_kv_unified_flag_env_and_file_reach_engine_config(monkeypatch):
    from llamabatch.settings.layers import merge

    monkeypatch.delenv("LLAMABATCH_KV_UNIFIED", raising=False)
    assert merge({}, "run").engine.kv_unified is False
    assert merge({"kv_unified": True}, "run").engine.kv_unified is True
    assert merge({}, "run", {"kv_unified": (True, "llamabatch.toml:3")}).engine.kv_unified is True
    monkeypatch.setenv("LLAMABATCH_KV_UNIFIED", "on")
    assert merge({}, "run").engine.kv_unified is True
    assert merge({"kv_unified": False}, "run").engine.kv_unified is False  # the flag wins


def test_kv_unified_with_deterministic_is_one_line_exit_2(tmp_path):
    from cli_harness import invoke, runner_for

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n', encoding="utf-8")
    result = invoke(["run", str(prompts), "--kv-unified", "--deterministic"], runner=runner_for())
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "kv_unified" in lines[0], result.stderr
