"""Throughput of the llamabatch engine against llama-cpp-python run one prompt at a time.

One workload, in one process: P prompts x M new tokens, greedy, T threads, through

  (a) llama-cpp-python's Llama.create_completion, one prompt after another
      (n_ctx=1024, one untimed warm-up call) - what a Python user has today;
  (b) the llamabatch Engine with N slots (1024 tokens of context each), per --slots value.

Both sides are made to generate the same number of tokens (the engine with ignore_eos; the
sequential side continues any completion that ends early with EOG banned), and tokens/s
comes from the completion tokens each side really reports. For the engine it also prints
the Python overhead per tick as a share of tick time, from the run's TickRecords, in two
definitions: (wall - llama_decode) / wall, and (wall - llama_decode - sampling) / wall.

It measures and prints; it never asserts on time. Usage:

  python benchmarks/engine_vs_sequential.py [--prompts 32] [--tokens 64] [--slots 8[,16]]
                                            [--threads 2] [--model PATH]
"""
from __future__ import annotations

import argparse
import sys

from _bench import (int_list, machine_line, model_path, positive, sequential, sky_prompts, timed_generate,
                    workload_args)

from llamabatch import Engine, EngineConfig, SamplingParams

SEQ_CTX = 1024  # the sequential Llama's context, and each engine slot's


def run_engine(model: str, prompts: list[str], max_tokens: int, threads: int, slots: int) -> dict:
    config = EngineConfig(model=model, n_parallel=slots, n_ctx=SEQ_CTX * slots, threads=threads)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with Engine(config) as engine:
        engine.generate(["warm up"], params.replace(max_tokens=4))  # untimed, like the sequential side
        run = timed_generate(engine, prompts, params)
    ticks, seconds = run.ticks, run.seconds
    wall = sum(t.wall_ms for t in ticks)
    decode = sum(t.eval_ms for t in ticks)
    sample = sum(t.sample_ms for t in ticks)
    return {
        "tokens": run.generated,
        "seconds": seconds,
        "failed": len(run.failed),
        "first_error": run.failed[0].error if run.failed else None,
        "ticks": len(ticks),
        "tick_wall_ms": wall,
        "overhead_vs_decode": (wall - decode) / wall if wall else 0.0,
        "overhead_vs_decode_sample": (wall - decode - sample) / wall if wall else 0.0,
        "mean_tick_ms": wall / len(ticks) if ticks else 0.0,
        "mean_decode_tokens": sum(t.decode_tokens for t in ticks) / len(ticks) if ticks else 0.0,
        "outside_ticks": (seconds * 1000 - wall) / (seconds * 1000) if seconds else 0.0,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, prompts=32, tokens=64, slots="8", threads=2, model=True)
    args = ap.parse_args(argv)
    args.slots = int_list(ap, args.slots)
    positive(ap, args, "prompts", "tokens", "threads")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = model_path(args.model)
    prompts = sky_prompts(args.prompts)
    print(f"workload: {args.prompts} prompts x {args.tokens} new tokens, greedy, {args.threads} threads, "
          f"model {model}; {machine_line(model)}", flush=True)

    seq = sequential(model, prompts, args.tokens, threads=args.threads, n_ctx=SEQ_CTX, same_length=True)
    note = f" ({seq.continued} continued past an early EOG)" if seq.continued else ""
    print(f"(a) llama-cpp-python sequential: {seq.tokens} tokens in {seq.seconds:.2f} s = {seq.tok_s:.1f} tok/s{note}",
          flush=True)

    for slots in args.slots:
        r = run_engine(model, prompts, args.tokens, args.threads, slots)
        tps = r["tokens"] / r["seconds"]
        print(f"(b) llamabatch engine, {slots} slots: {r['tokens']} tokens in {r['seconds']:.2f} s = {tps:.1f} tok/s"
              f"  -> {tps / seq.tok_s:.2f}x sequential", flush=True)
        print(f"    ticks: {r['ticks']}, mean {r['mean_tick_ms']:.1f} ms, "
              f"mean decode tokens per tick {r['mean_decode_tokens']:.2f}", flush=True)
        print(f"    python overhead per tick: (wall - llama_decode) / wall = {100 * r['overhead_vs_decode']:.2f}%; "
              f"(wall - decode - sampling) / wall = {100 * r['overhead_vs_decode_sample']:.2f}%", flush=True)
        print(f"    run time outside ticks (submit, thread wake-ups): {100 * r['outside_ticks']:.2f}%", flush=True)
        if r["tokens"] != seq.tokens:
            print(f"    note: token counts differ (engine {r['tokens']}, sequential {seq.tokens}); "
                  f"tok/s uses each side's real count", flush=True)
        if r["failed"]:
            print(f"    warning: {r['failed']} engine requests failed, first: {r['first_error']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
