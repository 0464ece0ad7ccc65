"""Where one shared KV cache stops paying against a stream per slot as answers grow: `run` over
short distinct prompts with answers of each length, --kv-unified against --no-kv-unified (slot
moves on), alternating per length and round. The rule in llamabatch/settings/kv_layout.py
rests on it.

Every line generates exactly its answer length (ignore_eos, greedy), so both layouts do the same
work; no prefix store. Printed: wall seconds of each and unified/streams speed (> 1: the shared
cache is faster).

Usage: python benchmarks/kv_layout_sweep.py [--answers 32,64,128,256] [--lines 32] [--rounds 2]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _bench import Pairs, int_list, machine_line, model_path, say, sky_prompts, timed_run, write_prompt_lines

LAYOUTS = {"unified": ["--kv-unified"], "streams": ["--no-kv-unified"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", default="32,64,128,256", help="answer lengths in tokens (default 32,64,128,256)")
    ap.add_argument("--lines", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-buffers", default="auto", help="the weight layout both arms load (auto, plain, repack)")
    ap.add_argument("-m", "--model", default=None)
    args = ap.parse_args()
    answers = int_list(ap, args.answers, "--answers")
    model = model_path(args.model)
    say(f"# KV layout sweep: {args.lines} short prompts, {args.slots} slots, {args.threads} threads; "
        f"{machine_line(model, args.cpu_buffers)}")
    print("| answer tokens | round | unified (s) | streams (s) | unified / streams speed |")
    print("|---|---|---|---|---|")
    ratios = {n: Pairs() for n in answers}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, args.rounds + 1):
            for n in answers:
                lines = write_prompt_lines(Path(tmp) / f"lines-{n}.jsonl", sky_prompts(args.lines), n)
                wall = {name: timed_run(lines, Path(tmp) / f"{name}.jsonl", args.lines, model, args.threads,
                                        "--n-parallel", str(args.slots), "--cpu-buffers", args.cpu_buffers,
                                        *flags) for name, flags in LAYOUTS.items()}
                ratio = ratios[n].add(wall["unified"], wall["streams"])
                print(f"| {n} | {r} | {wall['unified']:.1f} | {wall['streams']:.1f} | {ratio:.3f} |", flush=True)
    print("\n" + ", ".join(f"{n} tokens: median {ratios[n].median():.3f}" for n in answers))


if __name__ == "__main__":
    main()
