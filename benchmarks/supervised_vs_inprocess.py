"""`llamabatch run` with the engine in a supervised child process vs in the same process.

    python benchmarks/supervised_vs_inprocess.py [--prompts 32] [--tokens 64] [--slots 8] [--threads 2] [--pairs 3]

Runs the same prompts file through `llamabatch run --no-isolate` (A) and `llamabatch run`
(B, the default: supervised child) alternately, A B A B, in one process run, and prints each
side's generation throughput and the B/A ratio per pair. Throughput is completion tokens over
the run's own wall time from its summary (model load excluded: the child's extra start-up is
printed separately as end-to-end wall). Measures only; never asserts on time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_vs_sequential import make_prompts  # noqa: E402  (same prompts as the other run benchmark)

SUMMARY = re.compile(r"generated (\d+), ([\d.]+)s wall, ([\d.]+) generated tok/s")


def one_run(inp: Path, out: Path, isolate: bool, slots: int, threads: int) -> tuple[float, float]:
    """(generated tok/s over the run, end-to-end wall seconds) of one `llamabatch run` process."""
    cmd = [sys.executable, "-m", "llamabatch", "run", str(inp), "-o", str(out), "--n-parallel", str(slots),
           "--n-ctx", str(512 * slots), "--threads", str(threads), "--progress-every", "0",
           "--isolate" if isolate else "--no-isolate"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    match = SUMMARY.search(proc.stderr)
    if match is None:
        raise SystemExit(f"no summary in:\n{proc.stderr}")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    if len(records) != sum(1 for _ in inp.open()) or any(r["error"] for r in records):
        raise SystemExit(f"bad records: {records[:1]}")
    return int(match.group(1)) / float(match.group(2)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {args.slots} slots, {args.threads} threads; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.jsonl"
        with open(inp, "w") as f:
            for i, p in enumerate(make_prompts(args.prompts)):
                f.write(json.dumps({"id": i, "prompt": p, "max_tokens": args.tokens, "temperature": 0,
                                    "ignore_eos": True}) + "\n")
        for pair in range(1, args.pairs + 1):
            a_tps, a_wall = one_run(inp, Path(tmp) / "a.jsonl", False, args.slots, args.threads)
            b_tps, b_wall = one_run(inp, Path(tmp) / "b.jsonl", True, args.slots, args.threads)
            ratios.append(b_tps / a_tps)
            print(f"pair {pair}: in-process {a_tps:6.1f} tok/s ({a_wall:5.2f} s end to end) | "
                  f"supervised {b_tps:6.1f} tok/s ({b_wall:5.2f} s end to end) | ratio {b_tps / a_tps:.3f}")
    print(f"supervised / in-process generation throughput: median ratio {statistics.median(ratios):.3f} "
          f"over {len(ratios)} pairs (target >= 0.97)")


if __name__ == "__main__":
    main()
