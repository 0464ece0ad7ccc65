"""`llamabatch run` end to end vs a sequential llama-cpp-python loop, on the same prompts.

    python benchmarks/run_vs_sequential.py [--prompts 32] [--tokens 64] [--threads 2] [--slots 8 16]

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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOPICS = ["a lighthouse keeper", "the history of bread", "a robot learning to paint", "volcanoes", "a chess match",
          "the moon landing", "a lost cat", "honeybees", "a train journey across Siberia", "quantum computers",
          "an old library", "the first winter in a new city", "tides", "a jazz musician", "glaciers",
          "a small bakery", "desert plants", "a mountain rescue", "the printing press", "octopuses",
          "a marathon runner", "the northern lights", "a city at night", "ancient Rome", "a garden in spring",
          "submarines", "a village festival", "coral reefs", "a detective story", "the invention of the telephone",
          "migrating birds", "a storm at sea", "a clockmaker", "rainforests", "a space station", "the Silk Road"]


def make_prompts(n: int) -> list[str]:
    return [f"Here is a long, detailed essay about {TOPICS[i % len(TOPICS)]} (part {i // len(TOPICS) + 1}):\n\n"
            for i in range(n)]


def run_llamabatch(prompts: list[str], tokens: int, slots: int, threads: int, workdir: Path) -> tuple[int, float]:
    """Completion tokens and end-to-end wall seconds of one `llamabatch run` process."""
    inp, out = workdir / f"in-{slots}.jsonl", workdir / f"out-{slots}.jsonl"
    with open(inp, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p, "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
                    + "\n")
    cmd = [sys.executable, "-m", "llamabatch", "run", str(inp), "-o", str(out), "--n-parallel", str(slots),
           "--n-ctx", str(512 * slots), "--threads", str(threads), "-q"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in out.read_text().splitlines()]
    failed = [r for r in records if r["error"] is not None]
    if failed or len(records) != len(prompts):
        raise SystemExit(f"llamabatch run: {len(failed)} failed lines, {len(records)} records: {failed[:1]}")
    return sum(r["usage"]["completion_tokens"] for r in records), wall


def run_sequential(prompts: list[str], tokens: int, threads: int, model_path: str) -> tuple[int, float, float]:
    """Completion tokens, wall seconds with the model load, and the load alone."""
    from llama_cpp import Llama

    from llamabatch.llama.cpu_kernels import llama_uses_model_params  # what the engine loads with (see there)

    start = time.perf_counter()
    with llama_uses_model_params(None, model_path):
        llm = Llama(model_path=model_path, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    load = time.perf_counter() - start
    generated = 0
    for p in prompts:
        out = llm.create_completion(p, max_tokens=tokens, temperature=0)
        generated += out["usage"]["completion_tokens"]
    wall = time.perf_counter() - start
    del llm
    return generated, wall, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, nargs="+", default=[8, 16])
    args = ap.parse_args()

    from llamabatch.models.resolve import resolve_model

    model_path = resolve_model(None)
    prompts = make_prompts(args.prompts)
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {args.threads} threads, "
          f"{os.path.basename(model_path)}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")

    seq_tokens, seq_wall, seq_load = run_sequential(prompts, args.tokens, args.threads, model_path)
    seq_tps = seq_tokens / seq_wall
    print(f"sequential Llama.create_completion : {seq_tokens:5d} tokens in {seq_wall:6.2f} s "
          f"(model load {seq_load:.2f} s included) = {seq_tps:7.1f} tok/s")
    with tempfile.TemporaryDirectory() as tmp:
        for slots in args.slots:
            tok, wall = run_llamabatch(prompts, args.tokens, slots, args.threads, Path(tmp))
            tps = tok / wall
            print(f"llamabatch run --n-parallel {slots:<3d}    : {tok:5d} tokens in {wall:6.2f} s "
                  f"(end to end, one process) = {tps:7.1f} tok/s  -> {tps / seq_tps:.2f}x sequential")


if __name__ == "__main__":
    main()
