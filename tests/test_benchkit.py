"""benchkit's figures from hand-made records, and one level run on the scripted fake runner."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.bench.benchkit import (LevelRun, RequestTrace, baseline_figures, batched_figures, cycle_prompts, describe, latency_figures, parse_levels, percentile, read_prompt_file, run_level, speedup, synthetic_prompts, tick_summary)
from llamabatch.errors import InvalidRequest
from llamabatch.results import Result, Timings, Usage
from llamabatch.core.telemetry import TickRecord

from fake_runner import FakeRunner, text_tokens


def tick(n, prefill=0, decode=0, wall=10.0, eval_ms=8.0, sample_ms=1.0, active=1, queue=0):
    return TickRecord(tick=n, batch_size=prefill + decode, decode_tokens=decode, prefill_tokens=prefill,
                      active_slots=active, queue_depth=queue, eval_ms=eval_ms, sample_ms=sample_ms,
                      overhead_ms=wall - eval_ms - sample_ms, wall_ms=wall)


def trace(index, submitted, token_times, done, prompt_tokens=8, reason="length", cached=0):
    result = Result(index, "x", [], reason, Usage(prompt_tokens, cached, len(token_times)), Timings())
    return RequestTrace(index, prompt_tokens, submitted, list(token_times), done, result)


# -- percentiles ------------------------------------------------------------------------------

def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) == 0.0


def test_describe_mean_median_p99():
    d = describe([10.0, 20.0, 30.0, 100.0])
    assert d["mean"] == 40.0 and d["median"] == 25.0
    assert d["p99"] == pytest.approx(30 + 0.97 * 70)
    assert describe([]) == {"mean": 0.0, "median": 0.0, "p99": 0.0}


# -- options --------------------------------------------------------------------------------

def test_parse_levels():
    assert parse_levels("1,2,4") == [1, 2, 4]
    assert parse_levels(" 8 , 16 ") == [8, 16]
    for bad in ("0", "1,,2", "a", "", "1,-2", "2.5", "1;2"):
        with pytest.raises(InvalidRequest, match="--parallel must be a comma-separated list"):
            parse_levels(bad)


def test_read_prompt_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("first\n\n  \nsecond line\r\n", encoding="utf-8")
    assert read_prompt_file(str(f)) == [(1, "first"), (4, "second line")]
    with pytest.raises(InvalidRequest, match="No such file"):
        read_prompt_file(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(InvalidRequest, match="no prompts"):
        read_prompt_file(str(tmp_path / "empty.txt"))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidRequest, match="not UTF-8"):
        read_prompt_file(str(tmp_path / "bin.txt"))


# -- workload -------------------------------------------------------------------------------

def test_synthetic_prompts_are_exact_length_and_distinct():
    bos = 2

    def tokenize(text):  # a BOS then one token per character, like a model that adds BOS
        return [bos] + text_tokens(text)

    prompts = synthetic_prompts(tokenize, 40, 32)
    assert all(len(p) == 32 and p[0] == bos for p in prompts)
    assert len({tuple(p) for p in prompts}) == 40
    assert synthetic_prompts(tokenize, 3, 1) == [[bos]] * 3  # pp=1 leaves only the start token
    long = synthetic_prompts(tokenize, 2, 5000)  # longer than the text: it wraps
    assert all(len(p) == 5000 for p in long)


def test_cycle_prompts_reuses_from_the_top():
    assert cycle_prompts([[1], [2]], 5) == [[1], [2], [1], [2], [1]]


# -- llama-batched-bench columns ------------------------------------------------------------

def test_batched_figures_split_mixed_ticks_by_tokens():
    ticks = [
        tick(1, prefill=16, wall=100.0, active=2),           # pure prefill: all to T_PP
        tick(2, prefill=6, decode=2, wall=40.0, active=2),    # mixed: 30 ms PP, 10 ms TG
        tick(3, decode=2, wall=20.0, active=2),               # pure decode
        tick(4, decode=2, wall=20.0, active=2),
    ]
    traces = [trace(0, 0.0, [0.1, 0.12, 0.14, 0.16], 0.16), trace(1, 0.0, [0.15, 0.17, 0.19, 0.2], 0.2)]
    run = LevelRun(2, 512, traces, ticks, 0.0, 0.2)
    b = batched_figures(run, 8, 4)
    assert b["pl"] == 2 and b["pp"] == 8 and b["tg"] == 4
    assert b["n_kv"] == 2 * (8 + 4)
    assert b["t_pp"] == pytest.approx(0.130)
    assert b["t_tg"] == pytest.approx(0.050)
    assert b["t"] == pytest.approx(0.180)  # the summed tick wall time
    assert b["speed_pp"] == pytest.approx(22 / 0.130)  # prompt tokens evaluated / T_PP
    assert b["speed_tg"] == pytest.approx(6 / 0.050)  # decode tokens / T_TG
    assert b["speed"] == pytest.approx(24 / 0.180)
    assert b["elapsed_s"] == pytest.approx(0.2) and b["failed"] == 0


def test_batched_figures_with_no_decode_ticks_do_not_divide_by_zero():
    run = LevelRun(1, 512, [trace(0, 0.0, [0.05], 0.05)], [tick(1, prefill=8, wall=50.0)], 0.0, 0.05)
    b = batched_figures(run, 8, 1)
    assert b["t_tg"] == 0.0 and b["speed_tg"] == 0.0 and b["speed_pp"] == pytest.approx(160.0)


# -- vLLM latency --------------------------------------------------------------------------

def test_latency_figures_follow_vllm_definitions():
    a = trace(0, 1.0, [1.1, 1.2, 1.4], 1.4)        # TTFT 100, ITL 100 and 200, E2EL 400, TPOT 150
    b = trace(1, 1.0, [1.3, 1.4, 1.5], 1.6)        # TTFT 300, ITL 100, 100, E2EL 600, TPOT 150
    failed = trace(2, 1.0, [], 1.05, reason="error")
    lat = latency_figures([a, b, failed])
    assert lat["completed"] == 2 and lat["failed"] == 1
    assert lat["mean_ttft_ms"] == pytest.approx(200) and lat["median_ttft_ms"] == pytest.approx(200)
    assert lat["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 200)
    assert lat["mean_tpot_ms"] == pytest.approx(150)
    assert lat["mean_itl_ms"] == pytest.approx(125) and lat["median_itl_ms"] == pytest.approx(100)
    assert lat["p99_itl_ms"] == pytest.approx(197)
    assert lat["mean_e2el_ms"] == pytest.approx(500)
    assert lat["duration"] == pytest.approx(0.6)
    assert lat["request_throughput"] == pytest.approx(2 / 0.6)
    assert lat["output_throughput"] == pytest.approx(6 / 0.6)
    assert lat["total_token_throughput"] == pytest.approx((16 + 6) / 0.6)
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert lat[f"p99_{name}_ms"] >= lat[f"median_{name}_ms"]


def test_tpot_needs_two_tokens():
    lat = latency_figures([trace(0, 0.0, [0.2], 0.2)])
    assert lat["mean_tpot_ms"] == 0.0 and lat["mean_itl_ms"] == 0.0 and lat["mean_ttft_ms"] == pytest.approx(200)


# -- tick telemetry -------------------------------------------------------------------------

def test_tick_summary():
    ticks = [tick(1, prefill=16, wall=100.0, eval_ms=90.0, active=2),
             tick(2, prefill=6, decode=2, wall=40.0, eval_ms=30.0, active=2),
             tick(3, decode=1, wall=20.0, eval_ms=15.0, active=1, queue=1),
             tick(4, decode=1, wall=20.0, eval_ms=15.0, active=1)]
    s = tick_summary(ticks, n_parallel=2, n_batch=16)
    assert s["ticks"] == 4
    assert s["mean_batch_size"] == pytest.approx(26 / 4)
    assert s["token_fill"] == pytest.approx(26 / 64)
    assert s["slot_fill"] == pytest.approx(6 / 8)
    assert s["mixed_share"] == pytest.approx(0.25)
    overhead = (100 - 91) + (40 - 31) + 2 * (20 - 16)
    assert s["overhead_share"] == pytest.approx(overhead / 180)
    assert s["max_decode_tokens"] == 2 and s["mean_queue_depth"] == 0.25
    assert tick_summary([], 2, 16)["ticks"] == 0


# -- baseline -------------------------------------------------------------------------------

def test_baseline_figures_and_speedup():
    records = [{"seconds": 1.0, "prompt_tokens": 8, "completion_tokens": 4, "finish_reason": "length"},
               {"seconds": 3.0, "prompt_tokens": 8, "completion_tokens": 2, "finish_reason": "stop"}]
    base = baseline_figures(records)
    assert base["requests"] == 2 and base["seconds"] == 4.0 and base["stopped_early"] == 1
    assert base["total_token_throughput"] == pytest.approx(22 / 4)
    assert base["output_throughput"] == pytest.approx(6 / 4)
    level = {"latency": {"total_token_throughput": 11.0, "output_throughput": 6.0}}
    assert speedup(level, base) == {"speedup": pytest.approx(2.0), "speedup_output": pytest.approx(4.0)}


# -- one level on the fake runner -----------------------------------------------------------

def test_run_level_starts_every_request_in_one_tick_and_skips_the_warm_up():
    runner = FakeRunner(n_slots=4, slot_ctx=64, n_batch=64)
    engine = Engine(EngineConfig(n_parallel=4, n_batch=64, chunk_size=16), runner=runner,
                    default_params=SamplingParams(temperature=0))
    prompts = [text_tokens(f"p{i}-abc") for i in range(4)]
    seen: list[int] = []
    run = run_level(engine, prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                    on_token=seen.append)
    assert runner.close_calls == 1  # run_level closed the engine (so the last tick was recorded)
    assert len(run.traces) == 4 and all(t.ok for t in run.traces)
    assert all(len(t.token_times) == 5 for t in run.traces)
    assert sum(seen) == 20
    # warm-up = execute call 1; the level's first tick prefilled all four prompts together
    assert run.ticks[0].tick == 2 and run.ticks[0].prefill_tokens == sum(map(len, prompts))
    assert [t.decode_tokens for t in run.ticks[1:]] == [4, 4, 4, 4]
    assert all(t.decode_tokens <= 4 for t in run.ticks)
    b = batched_figures(run, 6, 5)
    assert b["generated_tokens"] == 20 and b["decode_tokens"] == 16 and b["cached_tokens"] == 0
