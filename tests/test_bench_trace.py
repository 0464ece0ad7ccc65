"""bench --verbose's trace (llamabatch/bench/trace.py) on the fake runner: ticks grouped by kind,
the JSON's "trace" agrees with its ticks, and the table shows every kind that happened."""
from __future__ import annotations

import json

from llamabatch.bench.tables import TRACE_COLUMNS
from llamabatch.bench.trace import trace_figures

from cli_harness import invoke, runner_for


def tick(n, decode, prefill, ubatches, eval_ms, wall_ms):
    return {"tick": n, "batch_size": decode + prefill, "decode_tokens": decode, "prefill_tokens": prefill,
            "ubatches": ubatches, "eval_ms": eval_ms, "sample_ms": 1.0, "plan_ms": 0.5, "fill_ms": 0.25,
            "after_ms": 0.75, "wall_ms": wall_ms}


def test_ticks_are_grouped_by_kind_with_means_and_shares():
    ticks = [tick(1, 0, 64, 1, 40.0, 50.0), tick(2, 2, 30, 2, 30.0, 40.0), tick(3, 4, 0, 1, 6.0, 10.0),
             tick(4, 4, 0, 1, 8.0, 10.0)]
    trace = trace_figures(ticks)
    assert list(trace) == ["decode", "mixed", "prefill", "all"]
    assert trace["decode"]["ticks"] == 2 and trace["decode"]["mean_eval_ms"] == 7.0
    assert trace["decode"]["share_of_wall"] == 20 / 110
    assert trace["mixed"]["mean_ubatches"] == 2 and trace["mixed"]["eval_ms_per_token"] == 30 / 32
    assert trace["prefill"]["mean_prefill_tokens"] == 64
    assert trace["all"]["ticks"] == 4 and trace["all"]["mean_wall_ms"] == 27.5
    assert trace["all"]["preemptions"] == 0
    assert trace_figures([{**ticks[0], "preemptions": 2}])["all"]["preemptions"] == 2
    assert trace_figures([]) == {}


def test_verbose_prints_the_trace_and_the_json_keeps_it(tmp_path):
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--pp", "24", "--tg", "6", "--parallel", "1,3", "--requests", "5", "--verbose",
                     "--json", str(out)], runner=runner_for())
    assert result.exit_code == 0, result.stderr
    for b in (1, 3):
        assert f"Trace, B={b}: mean per tick, by kind" in result.stdout
    assert all(name in result.stdout for name in ("Graph runs", "Eval ms/token", "After ms"))
    levels = json.loads(out.read_text())["levels"]
    for level in levels:
        assert level["trace"] == trace_figures(level["ticks"])
        assert level["trace"]["all"]["ticks"] == len(level["ticks"]) > 0
        assert all(t["ubatches"] >= 1 for t in level["ticks"])
    assert set(levels[1]["trace"]) <= {"decode", "mixed", "prefill", "all"} and "prefill" in levels[1]["trace"]
    quiet = invoke(["bench", "--pp", "8", "--tg", "2", "--parallel", "1"], runner=runner_for())
    assert quiet.exit_code == 0 and "Trace, B=" not in quiet.stdout
    assert len(TRACE_COLUMNS) == 17 and "Preempted" in result.stdout
