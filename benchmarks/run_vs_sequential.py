"""`llamabatch run` end to end vs a sequential llama-cpp-python loop, on the same prompts.

    python benchmarks/run_vs_sequential.py [--prompts 32] [--tokens 64] [--threads 2] [--slots 8 16] [-m MODEL]

Runs `llamabatch run` as a subprocess (process start, model load, every line, exit) once per
slot count, and `Llama.create_completion` over the same prompts one at a time, in one
process run. Prints throughput (completion tokens / wall seconds) and the ratios. Measures
only; never asserts on time.

Both sides decode greedily with the same thread count. llamabatch lines set `ignore_eos`
so each yields exactly --tokens tokens; llama-cpp-python's only way to do that is a Python
logits processor (copying the 262k-entry logits every token), which would slow the
baseline unfairly, so the loop runs plain and its throughput counts the tokens it actually
generated (printed, so an early stop shows).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _bench import (completion_tokens, essay_prompts, llamabatch_command, machine_line, model_path, read_records,
                    sequential, workload_args, write_prompt_lines)


def run_llamabatch(model: str, prompts: list[str], tokens: int, slots: int, threads: int,
                   workdir: Path) -> tuple[int, float]:
    """Completion tokens and end-to-end wall seconds of one `llamabatch run` process."""
    inp = write_prompt_lines(workdir / f"in-{slots}.jsonl", prompts, tokens)
    out = workdir / f"out-{slots}.jsonl"
    cmd = llamabatch_command("run", str(inp), "-o", str(out), "-m", model, "--n-parallel", str(slots),
                             "--n-ctx", str(512 * slots), "--threads", str(threads), "-q")
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    return completion_tokens(read_records(out, len(prompts))), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, prompts=32, tokens=64, threads=2, model=True)
    ap.add_argument("--slots", type=int, nargs="+", default=[8, 16], help="slot counts, one run each (default 8 16)")
    args = ap.parse_args()

    model = model_path(args.model)
    prompts = essay_prompts(args.prompts)
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {args.threads} threads, "
          f"{os.path.basename(model)}; {machine_line(model)}")

    # The baseline runs plain (no EOG ban, no warm-up), and its wall time includes the model load.
    seq = sequential(model, prompts, args.tokens, threads=args.threads, n_ctx=512, warm_up=False)
    seq_wall = seq.load_seconds + seq.seconds
    seq_tps = seq.tokens / seq_wall
    print(f"sequential Llama.create_completion : {seq.tokens:5d} tokens in {seq_wall:6.2f} s "
          f"(model load {seq.load_seconds:.2f} s included) = {seq_tps:7.1f} tok/s")
    with tempfile.TemporaryDirectory() as tmp:
        for slots in args.slots:
            tok, wall = run_llamabatch(model, prompts, args.tokens, slots, args.threads, Path(tmp))
            tps = tok / wall
            print(f"llamabatch run --n-parallel {slots:<3d}    : {tok:5d} tokens in {wall:6.2f} s "
                  f"(end to end, one process) = {tps:7.1f} tok/s  -> {tps / seq_tps:.2f}x sequential")


if __name__ == "__main__":
    main()
