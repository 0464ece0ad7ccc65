"""A `run` whose answers differ in length, so slots go idle in its tail: today's defaults against
a stream per slot with slot moves off (what `run` did before it chose its layout and kept the
busy slots consecutive).

64 lines (default), answers of 8-256 tokens spread evenly and shuffled (ignore_eos, greedy), 8
slots. Arms, alternating A B C each round:
  A  `run` with default settings (the layout chosen from the file; moves on with streams)
  B  `--no-kv-unified --no-slot-moves`
  C  `--no-kv-unified`, slot moves on (the moves alone)
Printed per round: wall seconds of each (no prefix store), A/B and C/B. The target reads A/B.

Usage: python benchmarks/run_tail.py [--lines 64] [--rounds 2] [--threads 2] [--slots 8]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from _bench import Pairs, machine_line, model_path, say, sky_prompts, timed_run

ARMS = {"A": [], "B": ["--no-kv-unified", "--no-slot-moves"], "C": ["--no-kv-unified"]}


def answer_lengths(n: int, low: int = 8, high: int = 256, seed: int = 7) -> list[int]:
    """n lengths spread evenly over low..high, shuffled (the same order every run)."""
    lengths = [low + round(i * (high - low) / max(n - 1, 1)) for i in range(n)]
    random.Random(seed).shuffle(lengths)
    return lengths


def write_lines(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i, (prompt, tokens) in enumerate(zip(sky_prompts(n), answer_lengths(n))):
            f.write(json.dumps({"id": i, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                                "ignore_eos": True}) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("-m", "--model", default=None)
    args = ap.parse_args()
    model = model_path(args.model)
    say(f"# run tail: {args.lines} lines, answers 8-256 tokens, {args.slots} slots, {args.threads} threads; "
        f"{machine_line(model)}")
    print("| round | A default (s) | B streams, moves off (s) | C streams, moves on (s) | A/B | C/B |")
    print("|---|---|---|---|---|---|")
    a_over_b, c_over_b = Pairs(), Pairs()
    with tempfile.TemporaryDirectory() as tmp:
        lines = write_lines(Path(tmp) / "lines.jsonl", args.lines)
        for r in range(1, args.rounds + 1):
            wall = {arm: timed_run(lines, Path(tmp) / f"{arm}.jsonl", args.lines, model, args.threads,
                                   "--n-parallel", str(args.slots), *flags) for arm, flags in ARMS.items()}
            ab, cb = a_over_b.add(wall["B"], wall["A"]), c_over_b.add(wall["B"], wall["C"])
            print(f"| {r} | {wall['A']:.1f} | {wall['B']:.1f} | {wall['C']:.1f} | {ab:.3f} | {cb:.3f} |", flush=True)
    print(f"\nmedian A/B {a_over_b.median():.3f} (target <= 0.87), C/B {c_over_b.median():.3f}")


if __name__ == "__main__":
    main()
