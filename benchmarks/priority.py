"""Priority through the library: an urgent request beside a full batch, in one process run.

    python benchmarks/priority.py [--slots 8] [--tokens 96] [--rounds 10] [--threads 2] [-m MODEL]

1. Time to first token of a short chat request (`Engine.submit(..., priority=-1)`) on an idle
   engine (A) and while --slots priority-0 requests hold every slot (B): ratio B / A per pair
   (target <= 1.5 median). Printed beside it: the same request at priority 0 (C: it waits for
   a slot, as every request did before priority), and at priority -1 with the decode in flight
   left to finish (D: the engine before core/tick_interrupt.py).
2. The batch's own speed: --slots requests of --tokens tokens alone (A) and with one urgent
   request arriving every second (B): ratio of output tokens per second B / A (target >= 0.9).
3. What a preemption costs in memory: the bytes of the parked slot's KV (llama.cpp's own
   llama_state_seq_get_size, through runner.snapshot), per preemption.

Measures and prints; asserts nothing on time.
"""
from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from _bench import Pairs, essay_prompts, machine_line, model_path, p95, say

# a short chat question, different each time (a prompt the prefix cache holds would make the
# idle figure one decode row); about 25 tokens with the chat template
# (its first words differ, so neither case reuses more of another question than the template)
QUESTIONS = iter(f"{i * 7919 % 10007} apples and {i} pears: in one word, which colour is the basket?"
                 for i in range(1, 10**9))


def open_engine(args: argparse.Namespace):
    from llamabatch import Engine, EngineConfig

    return Engine(EngineConfig(model=model_path(args.model), n_parallel=args.slots, n_ctx=512 * args.slots,
                               threads=args.threads))


def first_token_s(engine, priority: int) -> float:
    from llamabatch import SamplingParams

    start = time.perf_counter()
    urgent = [{"role": "user", "content": next(QUESTIONS)}]
    handle = engine.submit(urgent, SamplingParams(max_tokens=4, temperature=0, priority=priority))
    for delta in handle:
        if delta.token_ids:
            break
    took = time.perf_counter() - start
    handle.result()
    return took


def batch(engine, args: argparse.Namespace, tokens: int | None = None) -> list:
    from llamabatch import SamplingParams

    params = SamplingParams(max_tokens=tokens or args.tokens, temperature=0, ignore_eos=True)
    return [engine.submit(p, params, stream=False) for p in essay_prompts(args.slots)]


def wait_all_started(engine, n: int) -> None:
    while engine.stats().slots_generating < n:
        time.sleep(0.005)


def ttft_pair(engine, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """Idle, then beside the batch: priority -1, priority 0, and priority -1 with the decode in
    flight left to finish (the engine before core/tick_interrupt.py)."""
    idle = first_token_s(engine, -1)
    out = []
    for priority, interrupting in ((-1, True), (0, True), (-1, False)):
        handles = batch(engine, args)
        wait_all_started(engine, args.slots)
        time.sleep(random.uniform(0.0, 0.1))  # arriving anywhere in a tick (a decode tick of 8 rows: 50-70 ms here)
        if not interrupting:  # this benchmark's switch only: the engine has no setting for it
            engine.runner.interruptible = lambda plan: False
        try:
            out.append(first_token_s(engine, priority))
        finally:
            vars(engine.runner).pop("interruptible", None)
        for h in handles:
            h.cancel()
        for h in handles:
            h.result()
    return idle, out[0], out[1], out[2]


def batch_speed(engine, args: argparse.Namespace, with_urgent: bool) -> float:
    """Output tokens per second of the batch (its own tokens only)."""
    stop = threading.Event()

    def urgent_every_second() -> None:
        while not stop.wait(1.0):
            first_token_s(engine, -1)

    start = time.perf_counter()
    handles = batch(engine, args)
    sender = threading.Thread(target=urgent_every_second) if with_urgent else None
    if sender is not None:
        sender.start()
    results = [h.result() for h in handles]
    wall = time.perf_counter() - start
    stop.set()
    if sender is not None:
        sender.join()
    return sum(r.usage.completion_tokens for r in results) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96, help="tokens each batch request generates (default 96)")
    ap.add_argument("--rounds", type=int, default=10, help="A B pairs of the TTFT figure, half as many of the batch's (default 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-m", "--model", default=None, help="model (default: the bundled Gemma 3 270M)")
    args = ap.parse_args()
    from llamabatch.llama import kv_state

    parked: list[int] = []
    snapshot = kv_state.snapshot

    def counting(ctx, seq):
        data = snapshot(ctx, seq)
        parked.append(len(data))
        return data

    kv_state.snapshot = counting  # the runner's snapshot calls it: the preempted slots' bytes
    print(f"{args.slots} slots, batch requests of {args.tokens} tokens, {args.threads} threads; "
          f"{machine_line(model_path(args.model))}")
    with open_engine(args) as engine:
        first_token_s(engine, 0)  # warm: the first decode builds the graphs
        ttft, waiting, uninterrupted = Pairs(), [], []
        for r in range(1, args.rounds + 1):
            idle, urgent, plain, waited = ttft_pair(engine, args)
            ratio = ttft.add(idle, urgent)
            waiting.append(plain / idle)
            uninterrupted.append(waited / idle)
            print(f"ttft round {r}: idle {idle * 1000:.0f} ms, priority -1 beside {args.slots} running "
                  f"{urgent * 1000:.0f} ms -> {ratio:.2f}x; the same not interrupting the decode in flight "
                  f"{waited * 1000:.0f} ms -> {waited / idle:.2f}x; priority 0 (waits for a slot) "
                  f"{plain * 1000:.0f} ms -> {plain / idle:.2f}x")
        print(f"median: TTFT beside a full batch {ttft.median():.2f}x idle (target <= 1.5), p95 {p95(ttft.ratios):.2f}x "
              f"(target <= 2.5); not interrupting the decode in flight {statistics.median(uninterrupted):.2f}x, "
              f"p95 {p95(uninterrupted):.2f}x; without priority {statistics.median(waiting):.2f}x")
        speed = Pairs()
        for r in range(1, max(2, args.rounds // 2) + 1):
            alone, shared = batch_speed(engine, args, False), batch_speed(engine, args, True)
            ratio = speed.add(alone, shared)
            print(f"batch round {r}: alone {alone:.1f} tok/s, with an urgent request each second {shared:.1f} tok/s "
                  f"-> {ratio:.2f}x")
        print(f"median: batch speed {speed.median():.2f}x with urgent requests (target >= 0.9)")
        stats = engine.stats()
    print(f"decodes interrupted for an urgent request: {stats.interrupted_ticks}")
    if parked:
        print(f"preemptions: {stats.preemptions}; a parked slot's KV: median {statistics.median(parked) / 2**20:.2f} MiB, "
              f"max {max(parked) / 2**20:.2f} MiB (llama_state_seq_get_size)")
    say("done")


if __name__ == "__main__":
    main()
