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
import statistics
import time

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.models.resolve import check_gguf, resolve_model

SLOT_CTX = 1024


def make_prompts(n: int) -> list[str]:
    return [f"Question {i}: explain in a few sentences why the sky looks blue at noon and red at dusk."
            for i in range(n)]


def one_run(model: str, slots: int, deterministic: bool, prompts: list[str], tokens: int, threads: int,
            cpu_buffers: str | None = None) -> float:
    """Generated tokens per second of wall time for generate(prompts)."""
    config = EngineConfig(model=model, n_parallel=slots, n_ctx=SLOT_CTX * slots, threads=threads,
                          deterministic=deterministic, cpu_buffers=cpu_buffers)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    with Engine(config) as engine:
        engine.generate(["warm up"], SamplingParams(max_tokens=2, temperature=0.0))
        t0 = time.perf_counter()
        results = engine.generate(prompts, params)
        seconds = time.perf_counter() - t0
    generated = sum(len(r.token_ids) for r in results)
    bad = [r.error for r in results if r.finish_reason not in ("stop", "length")]
    if bad:
        raise SystemExit(f"{len(bad)} request(s) failed, first: {bad[0]}")
    return generated / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--slots", default="8,1,3,5", help="slot counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs per slot count")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    ap.add_argument("--cpu-buffers", choices=["auto", "plain", "repack"], default=None,
                    help="CPU weight layout for both modes [default: auto, what this machine would choose]")
    args = ap.parse_args()
    model = resolve_model(args.model)
    check_gguf(model)
    prompts = make_prompts(args.prompts)
    from llamabatch.llama.machine_verdicts import cpu_name
    from llamabatch.llama.cpu_kernels import kernel_path

    path = kernel_path(EngineConfig(model=model, cpu_buffers=args.cpu_buffers), model)
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {args.threads} threads, {SLOT_CTX} ctx per slot; "
          f"{cpu_name()}, {path.name} kernels ({path.why})")
    summary = []
    for slots in [int(s) for s in args.slots.split(",")]:
        ratios = []
        for r in range(args.rounds):
            a = one_run(model, slots, False, prompts, args.tokens, args.threads, args.cpu_buffers)
            b = one_run(model, slots, True, prompts, args.tokens, args.threads, args.cpu_buffers)
            ratios.append(b / a)
            print(f"slots {slots} round {r + 1}: default {a:7.1f} tok/s   deterministic {b:7.1f} tok/s   "
                  f"ratio {b / a:.2f}", flush=True)
        summary.append((slots, statistics.median(ratios)))
    print("median deterministic/default throughput: "
          + ", ".join(f"{s} slot{'s' if s != 1 else ''} {m:.2f}" for s, m in summary))


if __name__ == "__main__":
    main()
