"""The benchmark scripts stay runnable, and their shared helper (benchmarks/_bench.py) does
what they used to do each on their own. Only `--help` and the pure helpers run here: the
benchmarks themselves load the model and take minutes, so they are run by hand."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _bench

        yield _bench
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_script_answers_help(script, bench):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ended, \
            _argv([str(script), "--help"]):
        runpy.run_path(str(script), run_name="__main__")
    assert ended.value.code == 0
    assert out.getvalue().startswith(f"usage: {script.name}")


@contextlib.contextmanager
def _argv(argv: list[str]):
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def test_serve_batches_refuses_only_the_online_pair_without_the_online_pair(bench):
    err = io.StringIO()
    script = BENCHMARKS / "serve_batches.py"
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended, \
            _argv([str(script), "--online-only", "--no-online-each-second"]):
        runpy.run_path(str(script), run_name="__main__")
    assert ended.value.code == 2
    assert "--online-only measures the online-each-second pair" in err.getvalue()


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 11


def test_prompts_are_the_workloads_the_published_figures_used(bench):
    # docs/performance.md's figures were taken with these exact texts; a changed prompt is a new workload.
    assert bench.sky_prompts(2) == [
        "Question 0: explain in a few sentences why the sky looks blue at noon and red at dusk.",
        "Question 1: explain in a few sentences why the sky looks blue at noon and red at dusk."]
    assert bench.sky_prompts(1, short=True) == ["Question 0: explain in a few sentences why the sky looks blue at noon."]
    essays = bench.essay_prompts(37)
    assert essays[0] == "Here is a long, detailed essay about a lighthouse keeper (part 1):\n\n"
    assert essays[36] == "Here is a long, detailed essay about a lighthouse keeper (part 2):\n\n"
    assert len(set(essays)) == 37


def test_arguments_are_added_only_where_a_script_asks(bench):
    ap = bench.workload_args(argparse.ArgumentParser(), tokens=8, slots="8,16", model=True)
    args = ap.parse_args([])
    assert (args.tokens, args.slots, args.model) == (8, "8,16", None)
    assert not hasattr(args, "prompts") and not hasattr(args, "threads")
    assert bench.int_list(ap, "8, 16") == [8, 16]
    for bad in ("eight", "0", ""):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            bench.int_list(ap, bad)


def test_pairs_keep_each_ratio_and_their_median(bench):
    pairs = bench.Pairs()
    assert pairs.add(100.0, 97.0) == pytest.approx(0.97)
    pairs.add(80.0, 90.0)
    pairs.add(50.0, 50.0)
    assert pairs.ratios == pytest.approx([0.97, 1.125, 1.0])
    assert pairs.median() == pytest.approx(1.0)
    seen = []
    runs = iter([1, 2, 3, 4])
    result = bench.run_pairs(2, lambda: next(runs), lambda: next(runs), lambda r, a, b: seen.append((r, a, b)))
    assert result == [(1, 2), (3, 4)] and seen == [(1, 1, 2), (2, 3, 4)]  # A B A B, reported as measured


def test_p95_is_the_last_of_twenty_quantiles_and_one_value_its_own(bench):
    # statistics.quantiles' exclusive method, as priority.py's published p95 figures used
    assert bench.p95([float(i) for i in range(1, 11)]) == pytest.approx(10.45)
    assert bench.p95([float(i) for i in range(1, 101)]) == pytest.approx(95.95)
    assert bench.p95([2.0]) == 2.0


def test_tick_log_keeps_only_tick_records_until_taken(bench):
    class Engine:
        def subscribe(self, callback):
            self.callback = callback

    engine = Engine()
    log = bench.TickLog(engine)
    tick, request = argparse.Namespace(kind="tick"), argparse.Namespace(kind="request")
    engine.callback(tick)
    engine.callback(request)
    assert log.take() == [tick]
    assert log.take() == []


def test_run_input_lines_and_records(bench, tmp_path):
    path = bench.write_prompt_lines(tmp_path / "in.jsonl", ["a", "b"], 5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"id": 0, "prompt": "a", "max_tokens": 5, "temperature": 0, "ignore_eos": True},
                     {"id": 1, "prompt": "b", "max_tokens": 5, "temperature": 0, "ignore_eos": True}]
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps({"id": i, "error": None, "usage": {"completion_tokens": 5}}) + "\n"
                           for i in range(2)))
    assert bench.completion_tokens(bench.read_records(out, 2)) == 10
    with pytest.raises(SystemExit, match="1 of 3 records|2 of 3 records"):
        bench.read_records(out, 3)
    assert bench.llamabatch_command("run", "x")[-3:] == ["llamabatch", "run", "x"]


def test_machine_line_names_the_cpu_cores_and_load(bench):
    line = bench.machine_line()
    assert " cores, load average " in line


def _png(width: int, height: int, rows: list[bytes]) -> bytes:
    """A minimal RGB PNG: signature, IHDR, one IDAT, IEND (CRCs as PNG readers check them)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = b"".join(b"\x00" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_render_report_reads_a_pngs_size_and_tells_a_blank_one(bench):
    facts = runpy.run_path(str(BENCHMARKS / "render_report.py"))["png_facts"]
    blank = _png(3, 2, [b"\xff" * 9] * 2)
    drawn = _png(3, 2, [bytes(range(0, 90, 10)), bytes(range(100, 190, 10))])
    assert facts(blank) == (3, 2, 2)  # white and the filter byte: a page that did not draw
    assert facts(drawn)[:2] == (3, 2) and facts(drawn)[2] == 18  # 0..80 and 100..180 by tens; the filter byte is 0
    with pytest.raises(ValueError, match="not a PNG"):
        facts(b"GIF89a" + bytes(20))


def test_kv_cache_types_kl_divergence_is_zero_for_one_distribution_and_grows_with_the_gap(bench):
    kv = runpy.run_path(str(BENCHMARKS / "kv_cache_types.py"))
    top = [{"id": 1, "logprob": -0.1}, {"id": 2, "logprob": -2.5}, {"id": 3, "logprob": -4.0}]
    near = [{"id": 1, "logprob": -0.12}, {"id": 2, "logprob": -2.4}, {"id": 3, "logprob": -4.1}]
    swapped = [{"id": 2, "logprob": -0.1}, {"id": 1, "logprob": -2.5}, {"id": 4, "logprob": -4.0}]
    assert kv["kl_divergence"](top, top) == 0
    assert 0 < kv["kl_divergence"](top, near) < kv["kl_divergence"](top, swapped)
