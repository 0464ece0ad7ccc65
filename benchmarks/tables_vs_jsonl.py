"""Tables vs JSONL for `llamabatch run`: generated tok/s, and peak memory against the row count.

    python benchmarks/tables_vs_jsonl.py [--rows 3000] [--rounds 2] [--memory-rows 100000,1000000]
                                         [--skip-throughput] [--skip-memory] [--slots 16] [--threads 2] [-m MODEL]

Throughput (the bundled model): the same prompts as a JSONL file (A: `run in.jsonl -o out.jsonl`)
and as a Parquet table (B: `run in.parquet --template '{text}' -o out.parquet`), --max-tokens 1,
in pairs A B, B A, A B, ... Per pair: each side's generated tok/s as its summary line says (model
loaded to last record), the end-to-end rows/s of the whole process (load, run, and for B writing
the Parquet table from the records file), and the ratios B/A.

Memory (no model): peak RSS of a fresh process against the row count, for the two parts of a
table run that see every row: reading (read_rows over a Parquet file and a CSV of N rows, every
row templated) and writing (the table made from a records file of N records, as `run` does at
its end, for Parquet and CSV). Each is one process per (part, format, N); the figure is
VmHWM (the process's peak RSS; ru_maxrss would carry the parent's peak
across fork and exec). With --fake-run, also a whole job (llamabatch.jobs.run_job: reader,
engine, writer, records file, table) on the test suite's scripted fake runner (tests/fake_runner.py), JSONL -> JSONL and
Parquet -> Parquet, marked run*: the model itself is too slow on a small machine for a million
rows. The rest of `run` (the engine, the reorder window, the writer) is the JSONL path's,
whose memory is bounded by --max-inflight, except the seen-ids set (16 bytes an id, docs/long-jobs).

Measures only; never asserts. The machine line (CPU, cores, load) is printed first.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import ESSAY_TOPICS, Pairs, int_list, llamabatch_command, machine_line, model_path, workload_args

SUMMARY = re.compile(r"generated (\d+), ([\d.]+)s wall, ([\d.]+) generated tok/s")


def prompt(i: int) -> str:
    return f"Note {i}: one line about {ESSAY_TOPICS[i % len(ESSAY_TOPICS)]}"


def write_inputs(workdir: Path, rows: int) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = workdir / f"in-{rows}.jsonl"
    with open(jsonl, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": i + 1, "prompt": prompt(i)}) + "\n")
    parquet = workdir / f"in-{rows}.parquet"
    pq.write_table(pa.table({"text": [prompt(i) for i in range(rows)]}), parquet)
    return jsonl, parquet


def one_run(cmd: list[str]) -> tuple[float, float, int]:
    """(generated tok/s from the summary, end-to-end wall s, generated tokens)."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    m = SUMMARY.search(done.stderr)
    if not m:
        raise SystemExit(f"no summary line in:\n{done.stderr[-2000:]}")
    return float(m.group(3)), wall, int(m.group(1))


def throughput(args: argparse.Namespace, model: str, workdir: Path) -> None:
    jsonl, parquet = write_inputs(workdir, args.rows)
    common = ["-m", model, "--max-tokens", "1", "--n-parallel", str(args.slots), "--n-ctx", str(256 * args.slots),
              "--threads", str(args.threads), "--temperature", "0", "--progress-every", "100000"]
    run_a = llamabatch_command("run", str(jsonl), "-o", str(workdir / "out.jsonl"), *common)
    run_b = llamabatch_command("run", str(parquet), "--template", "{text}", "-o", str(workdir / "out.parquet"), *common)
    print(f"\nthroughput: {args.rows} rows, --max-tokens 1, {args.slots} slots, {args.threads} threads")
    print("pair | A jsonl tok/s | B parquet tok/s | B/A tok/s | A rows/s e2e | B rows/s e2e | B/A e2e | load")
    tok, e2e = Pairs(), Pairs()
    for r in range(1, args.rounds + 1):
        if r % 2:  # A B, then B A: a machine getting busier or quieter favours neither side
            a_tps, a_wall, a_gen = one_run(run_a)
            b_tps, b_wall, b_gen = one_run(run_b)
        else:
            b_tps, b_wall, b_gen = one_run(run_b)
            a_tps, a_wall, a_gen = one_run(run_a)
        if a_gen != args.rows or b_gen != args.rows:
            raise SystemExit(f"expected {args.rows} generated tokens each, got {a_gen} and {b_gen}")
        ratio = tok.add(a_tps, b_tps)
        ratio_e2e = e2e.add(args.rows / a_wall, args.rows / b_wall)
        print(f"{r:4d} | {a_tps:13.1f} | {b_tps:15.1f} | {ratio:9.3f} | {args.rows / a_wall:12.1f} | "
              f"{args.rows / b_wall:12.1f} | {ratio_e2e:7.3f} | {os.getloadavg()[0]:.2f}", flush=True)
    print(f"median B/A: generated tok/s {tok.median():.3f}, end to end {e2e.median():.3f}")


READ = """
import sys
from llamabatch.tables import read_rows
from llamabatch.tables.arrow_import import use_system_allocator
path = sys.argv[1]
if path.endswith(".parquet"):
    use_system_allocator()  # as run does (arrow_import.py)
n = ok = 0
for row in read_rows(path, template="Summarize: {text}", keep_columns=["text"]):
    n += 1
    ok += row.ok
print(n, ok, [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0])
"""

WRITE = """
import sys
from llamabatch.jobs.tables.table_layout import Layout
from llamabatch.jobs.tables.table_output import finalize
from llamabatch.tables.arrow_import import use_system_allocator
records, table, kind = sys.argv[1:4]
if kind == "parquet":
    use_system_allocator()
n = finalize(records, table, kind, Layout(("text",), False, rows=True), in_input_order=True)
print(n, n, [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0])
"""


FAKE_RUN = """
import sys
sys.path.insert(0, sys.argv[1])  # tests/: the scripted fake runner
import collections
from fake_runner import FakeRunner
from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.jobs import run_job
src, out = sys.argv[2:4]
config = EngineConfig(n_parallel=16)
runner = FakeRunner(n_slots=16, slot_ctx=config.slot_ctx, n_batch=config.n_batch)
# the fake runner logs every plan, job and sampler for the tests to inspect; keep the last few,
# or the fake's own logs would be what grows with the row count
for name in ("plans", "jobs", "samplers", "trims", "forks"):
    setattr(runner, name, collections.deque(maxlen=256))
with Engine(config, runner=runner, default_params=SamplingParams(max_tokens=1)) as engine:
    report = run_job(src, out, engine=engine, template="{text}" if src.endswith(".parquet") else None)
if report.error is not None:
    raise SystemExit(report.error)
print(0, 0, [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0])
"""


def write_memory_inputs(workdir: Path, rows: int) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [prompt(i) for i in range(rows)]
    parquet = workdir / f"mem-{rows}.parquet"
    pq.write_table(pa.table({"text": texts}), parquet)  # the writer's default row groups (1Mi rows)
    csv_path = workdir / f"mem-{rows}.csv"
    with open(csv_path, "w") as f:
        f.write("text\n")
        f.writelines(f"{t}\n" for t in texts)
    records = workdir / f"mem-{rows}.records.jsonl"
    with open(records, "w") as f:  # what run's writer puts in a records file, one per row
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i + 1, "row": i + 1, "text": " ok", "finish_reason": "length",
                                "usage": {"prompt_tokens": 12, "cached_tokens": 0, "completion_tokens": 1,
                                          "total_tokens": 13}, "seed": 1, "error": None, "input": {"text": t}})
                    + "\n")
    jsonl = workdir / f"mem-{rows}.jsonl"
    with open(jsonl, "w") as f:
        f.writelines(json.dumps({"id": i + 1, "prompt": t}) + "\n" for i, t in enumerate(texts))
    return {"parquet": parquet, "csv": csv_path, "records": records, "jsonl": jsonl}


def peak(script: str, *argv: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).resolve().parent.parent),
                                                                   os.environ.get("PYTHONPATH", "")] if p)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    n, _ok, kb = done.stdout.split()
    return int(kb), time.perf_counter() - start


def memory(args: argparse.Namespace, workdir: Path) -> None:
    sizes = int_list(argparse.ArgumentParser(), args.memory_rows, "--memory-rows")
    print(f"\nmemory: peak RSS (MB) of a fresh process, {' vs '.join(f'{n:,}' for n in sizes)} rows", flush=True)
    results: dict[tuple[str, str], list[int]] = {}
    for n in sizes:
        files = write_memory_inputs(workdir, n)
        for fmt in ("parquet", "csv"):
            kb, _ = peak(READ, str(files[fmt]))
            results.setdefault(("read", fmt), []).append(kb)
            kb, _ = peak(WRITE, str(files["records"]), str(workdir / f"out-{n}.{fmt}"), fmt)
            results.setdefault(("write", fmt), []).append(kb)
        if args.fake_run:  # the whole run on the fake runner: JSONL -> JSONL, and Parquet -> Parquet
            tests = str(Path(__file__).resolve().parent.parent / "tests")
            for fmt, out in (("jsonl", f"run-{n}.jsonl"), ("parquet", f"run-{n}.parquet")):
                kb, secs = peak(FAKE_RUN, tests, str(files[fmt]), str(workdir / out))
                results.setdefault(("run*", fmt), []).append(kb)
                print(f"  (fake run, {fmt}, {n:,} rows: {secs:.0f} s)", flush=True)
        for f in workdir.iterdir():
            if f.name.startswith(("mem-", "out-", "run-")):
                f.unlink()
    print("part | format | " + " | ".join(f"{n:,} rows" for n in sizes) + " | last/first")
    for (part, fmt), kbs in results.items():
        print(f"{part:5s} | {fmt:7s} | " + " | ".join(f"{kb / 1024:7.1f}" for kb in kbs)
              + f" | {kbs[-1] / kbs[0]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, threads=2, rounds=2, model=True)
    ap.add_argument("--rows", type=int, default=3000, help="rows per throughput run (default 3000)")
    ap.add_argument("--slots", type=int, default=16, help="engine slots (default 16)")
    ap.add_argument("--memory-rows", default="100000,1000000", help="row counts for the memory part (default "
                                                                    "100000,1000000)")
    ap.add_argument("--skip-throughput", action="store_true", help="only the memory part (no model)")
    ap.add_argument("--fake-run", action="store_true", help="memory part: also the whole `run` on the test suite's "
                                                            "fake runner (no model; about 2,000 rows/s)")
    ap.add_argument("--skip-memory", action="store_true", help="only the throughput part")
    args = ap.parse_args()
    model = None if args.skip_throughput else model_path(args.model)
    print(machine_line(model))
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_throughput:
            throughput(args, model, Path(tmp))
        if not args.skip_memory:
            memory(args, Path(tmp))


if __name__ == "__main__":
    main()
