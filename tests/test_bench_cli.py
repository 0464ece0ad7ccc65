"""`llamabatch bench` end to end on the bundled model (tiny pp/tg), and its bad values."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llamabatch.bench.tables import (BASELINE_COLUMNS, BATCHED_COLUMNS, LATENCY_COLUMNS, SPEEDUP_COLUMN, THROUGHPUT_COLUMNS, TICK_COLUMNS)

BATCHED_KEYS = ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")
LATENCY_KEYS = [f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")]
from cli_harness import invoke, runner_for

TICK_KEYS = ("tick", "batch_size", "decode_tokens", "prefill_tokens", "active_slots", "queue_depth", "eval_ms",
             "sample_ms", "overhead_ms", "wall_ms")


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamabatch", "bench", *args],
                          capture_output=True, text=True, timeout=300)


def header_row(stdout: str, first: str) -> list[str]:
    """The cells of the table header line whose first cell is `first`."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("┃│ ").split("┃")]
        if cells and cells[0] == first and len(cells) > 1:
            return cells
    raise AssertionError(f"no table header starting with {first!r} in:\n{stdout}")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory, model_path):
    folder = tmp_path_factory.mktemp("bench")
    out = folder / "bench.json"
    proc = bench("--pp", "8", "--tg", "4", "--parallel", "1,2", "--json", str(out), "--plot", "--html",
                 str(folder / "report.html"))
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text()), (folder / "report.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def with_baseline(tmp_path_factory, model_path):
    folder = tmp_path_factory.mktemp("bench-baseline")
    prompts = folder / "prompts.txt"
    prompts.write_text("Write a haiku about the sea.\n\nName three colours.\n", encoding="utf-8")
    out = folder / "bench.json"
    proc = bench("--prompts", str(prompts), "--tg", "4", "--parallel", "2", "--requests", "3", "--baseline",
                 "--ticks", "2", "--temperature", "0", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def test_prints_all_three_tables_with_every_column(synthetic):
    proc, *_ = synthetic
    out = proc.stdout
    for title in ("Throughput (llama-batched-bench columns)", "Request latency (vLLM names)", "Request throughput",
                  "Ticks, B=1 (all", "Ticks, B=2 (all"):
        assert title in out
    assert header_row(out, "PP") == list(BATCHED_COLUMNS)  # no Speedup without --baseline
    assert SPEEDUP_COLUMN not in out
    assert header_row(out, "B") in (list(LATENCY_COLUMNS), list(THROUGHPUT_COLUMNS))
    assert "Output tok/s" in out and "P99 ms" in out
    assert header_row(out, "Tick") == list(TICK_COLUMNS)
    for metric in ("TTFT", "TPOT", "ITL", "E2EL"):
        assert f"│ {metric}" in out
    assert "mean batch fill" in out and "of ticks mixed prefill with decode" in out
    assert "Python overhead" in out and "mean of" in out
    # people's lines (progress, notes) never land on stdout, data never on stderr
    assert "PP" not in proc.stderr and "Throughput" not in proc.stderr


def test_the_real_run_draws_its_plots_and_report(synthetic):
    # every drawn number is checked against the JSON in test_bench_charts.py (fake runner);
    # here: a real run draws them too, in ASCII through a pipe, and writes a report that parses
    from test_bench_charts import parse

    proc, doc, html = synthetic
    plots = proc.stdout[proc.stdout.index("Decode speed S_TG against B"):]
    assert plots.isascii() and "Tick timeline, B=2" in plots and "auto: B=" in plots
    report = parse(html)
    assert set(report.charts) == {"stg", "ttft", "tpot", "ticks-b1", "ticks-b2"}
    assert report.charts["stg"]["series"]["S_TG"] == [(float(lv["n_parallel"]), lv["batched"]["speed_tg"])
                                                      for lv in doc["levels"]]


def test_json_has_every_field_with_sane_values(synthetic):
    _, doc, _ = synthetic
    assert doc["llama_cpp_python_version"] and doc["llamabatch_version"]
    assert doc["machine"]["cpu_count"] >= 1 and doc["machine"]["platform"]
    assert doc["model"]["name"] and doc["model"]["architecture"] == "gemma3"
    assert doc["threads"] == min(doc["machine"]["cpus_usable"], 8) and doc["settings"]["parallel"] == [1, 2]
    assert doc["baseline"] is None
    assert [level["n_parallel"] for level in doc["levels"]] == [1, 2]
    for level in doc["levels"]:
        b_ = level["n_parallel"]
        batched = level["batched"]
        assert all(key in batched for key in BATCHED_KEYS)
        assert batched["pl"] == b_ and batched["pp"] == 8 and batched["tg"] == 4
        assert batched["n_kv"] == b_ * (8 + 4)
        assert batched["t_pp"] > 0 and batched["t_tg"] > 0
        assert batched["t"] == pytest.approx(batched["t_pp"] + batched["t_tg"])
        assert batched["speed_pp"] > 0 and batched["speed_tg"] > 0 and batched["speed"] > 0
        assert batched["generated_tokens"] == b_ * 4 and batched["failed"] == 0
        lat = level["latency"]
        assert all(key in lat for key in LATENCY_KEYS)
        for name in ("ttft", "tpot", "itl", "e2el"):
            assert lat[f"p99_{name}_ms"] >= lat[f"median_{name}_ms"] > 0
        assert lat["mean_e2el_ms"] >= lat["mean_ttft_ms"]
        assert lat["request_throughput"] > 0 and lat["output_throughput"] > 0
        assert lat["total_token_throughput"] > lat["output_throughput"]
        assert lat["completed"] == b_ and lat["total_output_tokens"] == b_ * 4
        ticks = level["ticks"]
        assert ticks and all(all(key in t for key in TICK_KEYS) for t in ticks)
        assert all(t["decode_tokens"] <= b_ for t in ticks)
        assert all(t["active_slots"] <= b_ for t in ticks)
        assert sum(t["prefill_tokens"] for t in ticks) == b_ * 8
        assert sum(t["decode_tokens"] for t in ticks) == b_ * 3  # the first token comes from the prompt pass
        summary = level["tick_summary"]
        assert summary["ticks"] == len(ticks)
        for share in ("token_fill", "slot_fill", "mixed_share", "overhead_share"):
            assert 0 <= summary[share] <= 1
        assert len(level["requests"]) == b_ and not level["errors"]


def test_baseline_adds_the_speedup_column(with_baseline):
    proc, doc = with_baseline
    out = proc.stdout
    assert header_row(out, "PP") == [*BATCHED_COLUMNS, SPEEDUP_COLUMN]
    assert header_row(out, "Requests") == list(BASELINE_COLUMNS)
    assert "Sequential baseline" in out
    assert "Ticks, B=2 (last 2 of" in out
    base = doc["baseline"]
    assert base["requests"] == 3 and base["seconds"] > 0 and base["total_token_throughput"] > 0
    assert base["generated_tokens"] >= 1 and len(base["per_request"]) == 3
    level = doc["levels"][0]
    assert level["speedup"] > 0 and level["speedup_output"] > 0
    assert f"{level['speedup']:.2f}x" in out
    # real prompts: 2 lines, the third request reuses the first; PP is their mean length
    assert doc["settings"]["prompts_file"].endswith("prompts.txt") and doc["settings"]["requests_per_level"] == [3]
    assert level["batched"]["generated_tokens"] == 12
    prompt_tokens = [r["prompt_tokens"] for r in level["requests"]]
    assert prompt_tokens[2] == prompt_tokens[0]
    assert level["batched"]["pp"] == pytest.approx(sum(prompt_tokens) / 3)


@pytest.mark.parametrize("args, message", [
    (["--parallel", "0"], "--parallel must be a comma-separated list of integers >= 1, got '0'"),
    (["--parallel", "1,,2"], "--parallel must be a comma-separated list"),
    (["--parallel", "two"], "--parallel must be a comma-separated list"),
    (["--tg", "-1"], "--tg must be an integer >= 1, got -1"),
    (["--pp", "0"], "--pp must be an integer >= 1, got 0"),
    (["--requests", "0"], "--requests must be an integer >= 1, got 0"),
    (["--ticks", "-3"], "--ticks must be an integer >= 0, got -3"),
    (["--prompts", "/nonexistent/prompts.txt"], "--prompts /nonexistent/prompts.txt: No such file or directory"),
    (["--json", "/nonexistent/dir/out.json"], "--json /nonexistent/dir/out.json: cannot write there"),
    (["--pp", "4000", "--tg", "200"], "does not fit a slot of 4096"),
    (["--parallel", "16", "--n-batch", "8"], "n_batch must be an integer >= n_parallel (16)"),
    (["--policy", "fastest"], "policy must be one of"),
])
def test_bad_values_are_one_line_and_exit_2(args, message):
    result = invoke(["bench", *args], runner=runner_for())
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llamabatch: error: ") and message in lines[0], result.stderr
    assert result.stdout == ""


def test_a_prompt_line_too_long_for_a_slot_names_its_line(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("short\n" + "many words " * 40 + "\n", encoding="utf-8")
    result = invoke(["bench", "--prompts", str(prompts), "--parallel", "2", "--n-ctx", "64", "--tg", "4"],
                    runner=runner_for())
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--prompts line 2:" in lines[0] and "do not fit a slot of 32" in lines[0]
