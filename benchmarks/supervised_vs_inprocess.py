"""`llamabatch run` with the engine in a supervised child process vs in the same process.

    python benchmarks/supervised_vs_inprocess.py [--prompts 32] [--tokens 64] [--slots 8] [--threads 2] [--pairs 3]
                                                 [-m MODEL]

Runs the same prompts file through `llamabatch run --no-isolate` (A) and `llamabatch run`
(B, the default: supervised child) alternately, A B A B, in one process run, and prints each
side's generation throughput and the B/A ratio per pair. Throughput is completion tokens over
the run's own wall time from its summary (model load excluded: the child's extra start-up is
printed separately as end-to-end wall). Measures only; never asserts on time.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

from _bench import (Pairs, essay_prompts, llamabatch_command, machine_line, model_path, read_records, run_pairs,
                    workload_args, write_prompt_lines)

SUMMARY = re.compile(r"generated (\d+), ([\d.]+)s wall, ([\d.]+) generated tok/s")


def one_run(model: str, inp: Path, out: Path, isolate: bool, slots: int, threads: int,
            lines: int) -> tuple[float, float]:
    """(generated tok/s over the run, end-to-end wall seconds) of one `llamabatch run` process."""
    cmd = llamabatch_command("run", str(inp), "-o", str(out), "-m", model, "--n-parallel", str(slots),
                             "--n-ctx", str(512 * slots), "--threads", str(threads), "--progress-every", "0",
                             "--isolate" if isolate else "--no-isolate")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    match = SUMMARY.search(proc.stderr)
    if match is None:
        raise SystemExit(f"no summary in:\n{proc.stderr}")
    read_records(out, lines)
    return int(match.group(1)) / float(match.group(2)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, prompts=32, tokens=64, slots=8, threads=2, model=True)
    ap.add_argument("--pairs", type=int, default=3, help="A B pairs (default 3)")
    args = ap.parse_args()
    model = model_path(args.model)
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {args.slots} slots, {args.threads} threads; "
          f"{machine_line(model)}")
    pairs = Pairs()
    with tempfile.TemporaryDirectory() as tmp:
        inp = write_prompt_lines(Path(tmp) / "in.jsonl", essay_prompts(args.prompts), args.tokens)

        def run(isolate: bool) -> tuple[float, float]:
            out = Path(tmp) / ("b.jsonl" if isolate else "a.jsonl")
            return one_run(model, inp, out, isolate, args.slots, args.threads, args.prompts)

        def report(pair: int, a: tuple[float, float], b: tuple[float, float]) -> None:
            print(f"pair {pair}: in-process {a[0]:6.1f} tok/s ({a[1]:5.2f} s end to end) | "
                  f"supervised {b[0]:6.1f} tok/s ({b[1]:5.2f} s end to end) | ratio {pairs.add(a[0], b[0]):.3f}")

        run_pairs(args.pairs, lambda: run(False), lambda: run(True), report)
    print(f"supervised / in-process generation throughput: median ratio {pairs.median():.3f} "
          f"over {len(pairs.ratios)} pairs (target >= 0.97)")


if __name__ == "__main__":
    main()
