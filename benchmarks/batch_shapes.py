"""Which batch shapes the CPU kernels like: the measurements behind the scheduler's shaping rules.

llama.cpp's CPU backend multiplies repacked quantized weights (Q4_K here) with a 4-row gemm
tile for `rows - rows % 4` activation rows and a 1-row gemv for the rest; with one KV
stream per slot a batch is split into ubatches of consecutive slots with equal tokens each.
This script drives the real runner with hand-made StepPlans and times, alternating A B A B:

  1. decode ticks at B = 1..8 slots (the kernel curve);
  2. decode ticks of B real slots padded to the next multiple of 4 with one scratch token
     in each idle slot (trimmed after every tick) against the same B unpadded;
  3. one prompt chunk of 4k+1 .. 4k+4 tokens: time per tick;
  4. a mixed tick (7 decoding slots + one prompt chunk): a chunk of 4k vs 4k+1 tokens (the
     first token of the chunk goes into the decode ubatch, the rest into its own).

It prints milliseconds per tick (median of the runs) and ratios per pair; it never asserts
on time. Usage: python benchmarks/batch_shapes.py [--threads 2] [--reps 7] [--model PATH]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from _bench import machine_line, model_path, workload_args

from llamabatch import EngineConfig, SamplingParams
from llamabatch.core.plan import Chunk, StepPlan, Trim
from llamabatch.llama.runner import LlamaRunner

SLOTS = 8
SLOT_CTX = 1024


class Bench:
    def __init__(self, model: str, threads: int):
        self.runner = LlamaRunner(EngineConfig(model=model, n_parallel=SLOTS, n_ctx=SLOTS * SLOT_CTX, threads=threads,
                                               n_batch=1024, cache_prompt=True), model)  # full-size SWA cache:
        # the scratch rows are trimmed off again (a Trim keeping part of a slot needs it, plan.Trim)
        self.samplers = [self.runner.build_sampler(SamplingParams(temperature=0, ignore_eos=True), 0)
                         for _ in range(SLOTS)]
        self.words = self.runner.tokenize(" ".join(f"line {i} of the ledger shows {i * 13 % 97} crates" for i in range(400)),
                                          special=False)
        self.pos = [0] * SLOTS
        self.last = [0] * SLOTS

    def reset(self, active: int, prompt_len: int = 16) -> None:
        """Every slot emptied; slots 0..active-1 get a short distinct prompt and a first token."""
        self.runner.execute(StepPlan(trims=[Trim(s, 0) for s in range(SLOTS)]))
        for s in range(SLOTS):
            self.pos[s] = 0
        chunks = []
        for s in range(active):
            toks = self.words[:1] + self.words[1 + 5 * s: prompt_len + 5 * s]
            chunks.append(Chunk(s, s, toks, 0, True, False, sampler=self.samplers[s]))
            self.pos[s] = len(toks)
        if chunks:
            result = self.run(StepPlan(chunks))
            self.last = [result.sampled.get(s, self.words[2]) for s in range(SLOTS)]

    def run(self, plan: StepPlan):
        result = self.runner.execute(plan)
        if result.status != 0:
            raise RuntimeError(f"decode status {result.status}")
        return result

    def decode_tick(self, active: int, pad_to: int = 0) -> float:
        chunks = [Chunk(s, s, [self.last[s]], self.pos[s], True, True, sampler=self.samplers[s])
                  for s in range(active)]
        scratch = list(range(active, max(active, pad_to)))
        chunks += [Chunk(s, s, [self.words[3]], self.pos[s], False, True) for s in scratch]
        t0 = time.perf_counter()
        result = self.run(StepPlan(chunks))
        dt = time.perf_counter() - t0
        for s in range(active):
            self.last[s] = result.sampled[s]
            self.pos[s] += 1
        # the scratch token is thrown away again
        self.runner.execute(StepPlan(trims=[Trim(s, self.pos[s]) for s in scratch]))
        return dt * 1000

    def close(self) -> None:
        for sampler in self.samplers:
            self.runner.free_sampler(sampler)
        self.runner.close()


def median_ms(fn, n: int) -> float:
    return statistics.median(fn() for _ in range(n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, threads=2, model=True)
    ap.add_argument("--reps", type=int, default=7, help="A B pairs per comparison")
    args = ap.parse_args()
    model = model_path(args.model)
    bench = Bench(model, args.threads)
    print(f"# batch shapes, {args.threads} threads (medians of {args.reps} alternating runs); {machine_line(model)}\n")
    try:
        bench.reset(SLOTS)
        for _ in range(3):
            bench.decode_tick(SLOTS)  # warm-up

        print("## 1. decode ticks\n\n| B | ms per tick | tok/s |\n|---|---|---|")
        curve = {}
        for b in range(1, SLOTS + 1):
            bench.reset(b)
            curve[b] = median_ms(lambda: bench.decode_tick(b), args.reps * 2)
            print(f"| {b} | {curve[b]:.1f} | {1000 * b / curve[b]:.1f} |", flush=True)

        print("\n## 2. decode ticks padded with scratch rows to a multiple of 4\n")
        print("| B | padded to | unpadded ms | padded ms | padded / unpadded per pair |\n|---|---|---|---|---|")
        for b in (1, 2, 3, 5, 6, 7):
            pad = -(-b // 4) * 4
            bench.reset(b)
            plain, padded = [], []
            for _ in range(args.reps):
                plain.append(median_ms(lambda: bench.decode_tick(b), 3))
                padded.append(median_ms(lambda: bench.decode_tick(b, pad), 3))
            print(f"| {b} | {pad} | {statistics.median(plain):.1f} | {statistics.median(padded):.1f} | "
                  f"{', '.join(f'{p / q:.2f}' for p, q in zip(padded, plain))} |", flush=True)

        print("\n## 3. one prompt chunk alone: n = 4k .. 4k+3 tokens\n")
        print("| n | ms per tick | ms per token |\n|---|---|---|")
        for n in (64, 65, 66, 67, 68, 252, 253, 254, 255, 256):
            def prefill(n=n) -> float:
                bench.runner.execute(StepPlan(trims=[Trim(0, 0)]))
                t0 = time.perf_counter()
                bench.run(StepPlan([Chunk(0, 0, bench.words[:n], 0, True, False, sampler=bench.samplers[0])]))
                return (time.perf_counter() - t0) * 1000
            ms = median_ms(prefill, args.reps)
            print(f"| {n} | {ms:.1f} | {ms / n:.3f} |", flush=True)

        print("\n## 4. a mixed tick: 7 slots decode, slot 7 evaluates a prompt chunk of n tokens\n")
        print("| n | ms per tick | per pair vs n = 64 |\n|---|---|---|")
        times: dict[int, list[float]] = {64: [], 65: []}
        for _ in range(args.reps):
            for n in (64, 65):  # alternating
                bench.reset(7)
                chunks = [Chunk(s, s, [bench.last[s]], bench.pos[s], True, True, sampler=bench.samplers[s])
                          for s in range(7)]
                chunks.append(Chunk(7, 7, bench.words[:n], 0, True, False, sampler=bench.samplers[7]))
                t0 = time.perf_counter()
                bench.run(StepPlan(chunks))
                times[n].append((time.perf_counter() - t0) * 1000)
        for n in (64, 65):
            print(f"| {n} | {statistics.median(times[n]):.1f} | "
                  f"{', '.join(f'{t / b:.2f}' for t, b in zip(times[n], times[64]))} |", flush=True)
    finally:
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
