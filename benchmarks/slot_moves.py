"""No holes between busy slots: what a slot move costs, and a decode tick with k of 8 slots busy
at alternate slots against the same k requests in slots 0..k-1.

1. copy: the runner driven with hand-made StepPlans, a decode tick of one slot with a Move of
   full slots into empty ones (plan.Move: llama.cpp copies the whole stream, slot_ctx cells of
   every layer, at the start of that decode) against the same tick without, alternating; the
   difference per move is the copy (beside it, a plain memcpy of as many bytes). Also one
   extra graph run (a decode tick of slots 0 and 2 against 1 and 2), what an idle slot between
   busy ones costs every tick until it is filled.
2. partial load, through the Engine (TickRecords by Engine.subscribe): 8 slots, k long
   requests (ignore_eos) on alternate slots beside k that end after 2 tokens, with moves on
   (A: the default) against k long requests alone on slots 0..k-1 (B); and, for reference,
   the alternate layout with moves off. Reported: ms per decode tick of exactly the k rows
   (median), graph runs per such tick (TickRecord.ubatches: load-independent), moves made,
   and the ratio of each A B pair.

Timing on a shared machine is noisy: read the ratio within a pair and the graph-run counts.
Usage: python benchmarks/slot_moves.py [--threads 2] [--rounds 3] [--tokens 64] [--busy 4]
"""
from __future__ import annotations

import argparse
import statistics
import time

from _bench import Pairs, machine_line, model_path, say, workload_args

from llamabatch import Engine, EngineConfig, SamplingParams, TickRecord
from llamabatch.core.plan import Chunk, Move, StepPlan, Trim
from llamabatch.llama.runner import LlamaRunner

SLOTS = 8
COPIES = 3  # moves in one measured tick


def copy_cost(model: str, threads: int, slot_ctx: int, reps: int) -> tuple[float, float, float, float, float]:
    """(ms one Move adds to a decode tick, ms of a one-row decode tick, ms one extra graph run
    adds to a two-row decode tick, MiB of one slot's stream, ms a memcpy of that many bytes
    takes), from the fastest of `reps` alternating runs of each (on a loaded machine the
    fastest run is the least disturbed). A moving tick carries COPIES moves, for signal."""
    runner = LlamaRunner(EngineConfig(model=model, n_parallel=SLOTS, n_ctx=SLOTS * slot_ctx, threads=threads,
                                      n_batch=512, cache_prompt=True), model)
    sampler = runner.build_sampler(SamplingParams(temperature=0, ignore_eos=True), 0)
    words = runner.tokenize(" ".join(f"row {i} holds {i * 7 % 31} jars" for i in range(300)), special=False)
    pos = [0] * SLOTS
    try:
        for s in range(1 + COPIES):
            runner.execute(StepPlan([Chunk(s, s, words[:256], 0, True, False, sampler=sampler)]))
            pos[s] = 256

        def tick(slots: list[int], moves: list[Move] = ()) -> float:
            chunks = [Chunk(s, s, [words[5]], pos[s], True, True, sampler=sampler) for s in slots]
            t0 = time.perf_counter()
            result = runner.execute(StepPlan(chunks, moves=list(moves)))
            dt = (time.perf_counter() - t0) * 1000
            assert result.status == 0 and not result.emptied, result
            for s in slots:
                pos[s] += 1
            return dt

        def moving() -> float:  # COPIES full slots copied into emptied ones, beside a one-row decode
            targets = range(1 + COPIES, 1 + 2 * COPIES)
            runner.execute(StepPlan(trims=[Trim(t, 0) for t in targets]))
            return tick([0], [Move(s, t, pos[s]) for s, t in zip(range(1, 1 + COPIES), targets)])

        mib = runner.capabilities.kv_mib / SLOTS
        block = bytearray(int(mib * 2 ** 20))

        def memcpy() -> float:
            t0 = time.perf_counter()
            bytearray(block)
            return (time.perf_counter() - t0) * 1000

        for _ in range(3):
            tick([0]), moving()  # warm-up
        plain, moved, one_run, two_runs, copied = [], [], [], [], []
        for _ in range(reps):
            plain.append(tick([0]))
            moved.append(moving())
            two_runs.append(tick([0, 2]))
            one_run.append(tick([1, 2]))
            copied.append(memcpy())
        return ((min(moved) - min(plain)) / COPIES, min(plain), min(two_runs) - min(one_run), mib, min(copied))
    finally:
        runner.free_sampler(sampler)
        runner.close()


def partial_load(config: dict, busy: int, tokens: int, layout: str) -> tuple[float, float, int]:
    """(median ms of a decode tick of exactly `busy` rows, graph runs per such tick, moves), on
    a fresh engine: cached prompts and slots' last use would draw a later batch elsewhere."""
    long = SamplingParams(temperature=0, ignore_eos=True, max_tokens=tokens)
    short = SamplingParams(temperature=0, ignore_eos=True, max_tokens=2)
    ticks: list[TickRecord] = []
    with Engine(EngineConfig(**config)) as engine:
        engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
        with engine.hold():  # admitted together, request i on slot i
            if layout == "consecutive":
                handles = [engine.submit(f"Story {i}: the lighthouse keeper", long) for i in range(busy)]
            else:
                handles = [engine.submit(f"Story {i}: the lighthouse keeper", long if i % 2 == 0 else short)
                           for i in range(2 * busy)]
        for h in handles:
            h.result(600)
    decode = [t for t in ticks if t.decode_tokens == busy and t.prefill_tokens == 0 and t.moves == 0]
    return (statistics.median(t.wall_ms for t in decode), statistics.mean(t.ubatches for t in decode),
            sum(t.moves for t in ticks))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, threads=2, rounds=3, tokens=64, model=True)
    ap.add_argument("--busy", type=int, default=4, help="long requests (k of 8 slots; default 4)")
    ap.add_argument("--slot-ctx", type=int, default=4096, help="cells a slot holds (default 4096)")
    ap.add_argument("--skip-copy", action="store_true", help="only the partial-load comparison")
    ap.add_argument("--skip-load", action="store_true", help="only the copy cost")
    args = ap.parse_args()
    model = model_path(args.model)
    print(f"# slot moves, {args.threads} threads, {SLOTS} slots of {args.slot_ctx} cells; {machine_line(model)}\n")
    if not args.skip_copy:
        print("## 1. what a move costs (fastest of each)\n\n| slot_ctx | stream MiB | a move adds (ms) | memcpy of a stream (ms) "
              "| 1-row decode tick (ms) | one extra graph run (ms) |\n|---|---|---|---|---|---|")
        for ctx in (1024, args.slot_ctx):
            say(f"copy cost at {ctx} cells")
            cost, tick, split, mib, memcpy = copy_cost(model, args.threads, ctx, args.rounds * 8)
            print(f"| {ctx} | {mib:.1f} | {cost:.2f} | {memcpy:.2f} | {tick:.1f} | {split:.1f} |", flush=True)
    if args.skip_load:
        return 0
    print(f"\n## 2. {args.busy} of {SLOTS} slots busy, {args.tokens} tokens each\n")
    print("| round | A: alternate, moves on (ms/tick, runs/tick, moves) | B: slots 0..k-1 (ms/tick, runs/tick) "
          "| A/B | alternate, moves off (ms/tick, runs/tick) |\n|---|---|---|---|---|")
    config = dict(model=model, n_parallel=SLOTS, n_ctx=SLOTS * args.slot_ctx, threads=args.threads)
    pairs = Pairs()
    partial_load(config, args.busy, 8, "consecutive")  # warm-up
    for r in range(1, args.rounds + 1):
        a = partial_load(config, args.busy, args.tokens, "alternate")
        b = partial_load(config, args.busy, args.tokens, "consecutive")
        c = partial_load({**config, "slot_moves": False}, args.busy, args.tokens, "alternate")
        ratio = pairs.add(b[0], a[0])
        print(f"| {r} | {a[0]:.1f}, {a[1]:.2f}, {a[2]} | {b[0]:.1f}, {b[1]:.2f} | {ratio:.2f} | {c[0]:.1f}, {c[1]:.2f} |",
              flush=True)
    print(f"\nmedian A/B {pairs.median():.2f} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
