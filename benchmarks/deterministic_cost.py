"""What `--deterministic` costs: the same workload through the default engine and the
deterministic one, side by side in one process, alternating A B A B.

Workload: P prompts x M generated tokens (ignore_eos, so every request generates exactly M),
greedy, T threads, 1024 tokens of context per slot. Each round loads a fresh engine per
mode and times generate() over all prompts (model load not timed; one untimed warm-up
request per engine). Prints generated tokens/s of each run, the deterministic/default ratio
per A-B pair, and the median ratio per slot count. It measures and prints; it never asserts
on time. Usage:

  python benchmarks/deterministic_cost.py [--prompts 32] [--tokens 64] [--slots 8,1,3,5]
                                          [--rounds 2] [--threads 2] [--model PATH]
                                          [--cpu-buffers auto|plain|repack]
"""
from __future__ import annotations

import argparse

from _bench import Pairs, int_list, machine_line, model_path, run_pairs, sky_prompts, timed_generate, workload_args

from llamabatch import Engine, EngineConfig, SamplingParams

SLOT_CTX = 1024


def one_run(model: str, slots: int, deterministic: bool, prompts: list[str], tokens: int, threads: int,
            cpu_buffers: str | None = None) -> float:
    """Generated tokens per second of wall time for generate(prompts)."""
    config = EngineConfig(model=model, n_parallel=slots, n_ctx=SLOT_CTX * slots, threads=threads,
                          deterministic=deterministic, cpu_buffers=cpu_buffers)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    with Engine(config) as engine:
        engine.generate(["warm up"], SamplingParams(max_tokens=2, temperature=0.0))
        run = timed_generate(engine, prompts, params)
    generated = sum(len(r.token_ids) for r in run.results)
    bad = [r.error for r in run.results if r.finish_reason not in ("stop", "length")]
    if bad:
        raise SystemExit(f"{len(bad)} request(s) failed, first: {bad[0]}")
    return generated / run.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap, prompts=32, tokens=64, slots="8,1,3,5", rounds=2, threads=2, model=True, cpu_buffers=True)
    args = ap.parse_args()
    slot_counts = int_list(ap, args.slots)
    model = model_path(args.model)
    prompts = sky_prompts(args.prompts)
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {args.threads} threads, {SLOT_CTX} ctx per slot; "
          f"{machine_line(model, args.cpu_buffers)}")
    summary = []
    for slots in slot_counts:
        pairs = Pairs()

        def run(deterministic: bool, slots: int = slots) -> float:
            return one_run(model, slots, deterministic, prompts, args.tokens, args.threads, args.cpu_buffers)

        def report(r: int, a: float, b: float, slots: int = slots, pairs: Pairs = pairs) -> None:
            print(f"slots {slots} round {r}: default {a:7.1f} tok/s   deterministic {b:7.1f} tok/s   "
                  f"ratio {pairs.add(a, b):.2f}", flush=True)

        run_pairs(args.rounds, lambda: run(False), lambda: run(True), report)
        summary.append((slots, pairs.median()))
    print("median deterministic/default throughput: "
          + ", ".join(f"{s} slot{'s' if s != 1 else ''} {m:.2f}" for s, m in summary))


if __name__ == "__main__":
    main()
