"""What logprobs cost per generated token: the same workload with and without them.

One engine, one process: P prompts x M tokens, greedy with ignore_eos (so every round
generates exactly the same number of tokens), run in rounds that alternate

  A: no logprobs            B: logprobs with K alternatives per token   (A B A B ...)

For each round it prints wall seconds, generated tok/s and the sampling time per generated
token from the run's TickRecords (`sample_ms`: llama.cpp's sampler plus, for B, the
logprob pass over the whole vocabulary), and per A/B pair the ratio. It also times the
logprob pass alone (runner._logprobs on one logits row) for K = 0, 5, 20. It measures and
prints; it never asserts on time.

  python benchmarks/logprobs_cost.py [--prompts 8] [--tokens 32] [--top 5] [--rounds 2]
                                     [--slots 8] [--threads 2] [--model PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

from _bench import machine_line, model_path, run_pairs, sky_prompts, timed_generate, workload_args

from llamabatch import Engine, EngineConfig, SamplingParams


def one_round(engine: Engine, prompts: list[str], params: SamplingParams) -> dict:
    run = timed_generate(engine, prompts, params)
    if params.logprobs is not None:
        assert all(len(r.logprobs) == r.usage.completion_tokens for r in run.results)
    return {"seconds": run.seconds, "tokens": run.generated, "tok_s": run.tok_s,
            "sample_ms_per_token": sum(t.sample_ms for t in run.ticks) / run.generated}


def time_pass(engine: Engine, top: int, repeats: int = 50) -> float:
    """ms per call of the runner's logprob pass over the last logits row the engine produced
    (row -1: llama.cpp's "last row with logits"). The engine is idle between rounds."""
    runner = engine.runner
    runner.logprobs.from_row(runner.ctx, -1, 0, top)  # warm: scratch buffer, token text cache
    t0 = time.perf_counter()
    for _ in range(repeats):
        runner.logprobs.from_row(runner.ctx, -1, 0, top)
    return (time.perf_counter() - t0) * 1000 / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    workload_args(ap, prompts=8, tokens=32, rounds=2, slots=8, threads=2, model=True)
    ap.add_argument("--top", type=int, default=5, help="alternatives per token in B (default 5)")
    args = ap.parse_args()
    model = model_path(args.model)
    prompts = sky_prompts(args.prompts, short=True)
    base = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    config = EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots, threads=args.threads,
                          cache_prompt=False)
    print(f"{args.prompts} prompts x {args.tokens} tokens, {args.slots} slots, {args.threads} threads, "
          f"logprobs with {args.top} alternatives vs none; rounds alternate A B; {machine_line(model)}")
    with Engine(config) as engine:
        engine.generate(["warm up"], base.replace(max_tokens=4, logprobs=args.top))  # untimed

        def report(r: int, a: dict, b: dict) -> None:
            for name, x in (("A none", a), (f"B top {args.top}", b)):
                print(f"round {r} {name:9s} {x['seconds']:6.2f} s  {x['tok_s']:7.1f} tok/s  "
                      f"sampling {x['sample_ms_per_token']:.3f} ms/token")
            print(f"round {r} B/A: wall x{b['seconds'] / a['seconds']:.3f}, sampling +"
                  f"{b['sample_ms_per_token'] - a['sample_ms_per_token']:.3f} ms/token")

        pairs = run_pairs(args.rounds, lambda: one_round(engine, prompts, base),
                          lambda: one_round(engine, prompts, base.replace(logprobs=args.top)), report)
        extra = statistics.median(b["sample_ms_per_token"] - a["sample_ms_per_token"] for a, b in pairs)
        wall = statistics.median(b["seconds"] / a["seconds"] for a, b in pairs)
        print(f"median over {args.rounds} pairs: logprobs add {extra:.3f} ms of sampling per token, wall x{wall:.3f}")
        n_vocab = engine.runner.n_vocab
        for k in (0, 5, 20):
            print(f"logprob pass alone (vocabulary {n_vocab}), top {k:2d}: {time_pass(engine, k):.3f} ms per token")


if __name__ == "__main__":
    main()
