"""Plain requests' decode time with and without a costly grammar request beside them.

    python benchmarks/slow_grammar.py [--plain 4] [--tokens 8] [--enum 10000] [--pairs 2] [--threads 2]

One engine on the bundled model (the load is not timed). A: `--plain` greedy requests of
`--tokens` tokens alone. B: the same requests submitted in the same tick as one request with
`json_schema = {"enum": ["v0", ..., "v<enum-1>"]}` (each of its tokens costs llama.cpp's
grammar sampler seconds to minutes on a 262,144-token vocabulary). A B A B: each pair prints
the plain requests' mean and worst decode time (first token to last) and time to last
result, and the B/A ratios (the aim: decode time within 2x). B cancels the enum
request once the plain ones are done, and the next run starts only after its sampling
thread has stopped. Each pair also prints the process's CPU seconds in both runs and how many of B's went to the
sampling thread: on a shared machine, where wall times swing with other jobs, that says
whether B did more work beside the plain requests. `--inline` samples B's enum in the tick (as before sampling threads, core/sampling_threads.py): expect
every plain token to wait for an enum token. Measures only; never asserts on time.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

from _bench import Pairs, machine_line, workload_args

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.sampling_threads import THREAD_NAME


def sampling_threads_cpu() -> float:
    """CPU seconds used so far by this process's sampling threads (named sampling_threads.THREAD_NAME
    at the OS level), from /proc; 0 elsewhere."""
    total = 0
    for task in glob.glob("/proc/self/task/*"):
        try:
            if open(f"{task}/comm").read().strip() != THREAD_NAME:
                continue
            fields = open(f"{task}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:  # the thread ended meanwhile
            continue
    return total / os.sysconf("SC_CLK_TCK")


def plain_run(engine: Engine, args: argparse.Namespace, with_enum: bool) -> dict[str, float]:
    plain = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    enum = SamplingParams(temperature=0, max_tokens=16, json_schema={"enum": [f"v{i}" for i in range(args.enum)]})
    enum_tokens = []  # the enum request's tokens so far (its callback runs on the engine thread)
    cpu0, sampling0 = time.process_time(), sampling_threads_cpu()
    start = time.perf_counter()
    with engine.hold():  # all admitted in one tick
        slow = engine.submit("Pick one value:", enum, stream=False,
                             callback=lambda h, item: enum_tokens.extend(getattr(item, "token_ids", []))) \
            if with_enum else None
        handles = [engine.submit(f"Count from {i} to {i + 20}:", plain) for i in range(args.plain)]
    results = [h.result(timeout=3600) for h in handles]
    last = time.perf_counter() - start
    cpu, sampling = time.process_time() - cpu0, sampling_threads_cpu() - sampling0
    assert all(r.finish_reason == "length" and r.usage.completion_tokens == args.tokens for r in results)
    enum_done = len(enum_tokens)
    if slow is not None:
        slow.cancel()
        slow.result(timeout=3600)
        while engine.sampling_threads is not None and engine.sampling_threads.busy:  # its sampling thread stops within a slice
            time.sleep(0.05)
    decode = [r.timings.decode_ms / 1000 for r in results]
    return {"mean": statistics.mean(decode), "worst": max(decode), "last": last, "enum_tokens": enum_done,
            "cpu": cpu, "sampling_cpu": sampling}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plain", type=int, default=4, help="plain requests (default 4)")
    workload_args(ap, tokens=8, threads=2)
    ap.add_argument("--enum", type=int, default=10000, help="strings in the enum (default 10000)")
    ap.add_argument("--pairs", type=int, default=2, help="A B pairs (default 2)")
    ap.add_argument("--inline", action="store_true", help="sample the enum in the tick, as before sampling threads")
    args = ap.parse_args()
    print(f"{args.plain} plain requests x {args.tokens} tokens (greedy) beside one json_schema enum of "
          f"{args.enum} strings; {args.threads} threads, {args.plain + 1} slots; {machine_line()}; enum sampled "
          f"{'inline' if args.inline else 'apart (default)'}")
    config = EngineConfig(n_parallel=args.plain + 1, n_ctx=(args.plain + 1) * 256, threads=args.threads)
    pairs = Pairs()
    with Engine(config) as engine:
        if args.inline:
            engine.scheduler.sample_apart = None
        plain_run(engine, args, False)  # warm-up: first-touch of the weights
        for pair in range(1, args.pairs + 1):
            a = plain_run(engine, args, False)
            b = plain_run(engine, args, True)
            pairs.add(a["mean"], b["mean"])
            print(f"pair {pair}: A alone  decode mean {a['mean']:6.2f} s, worst {a['worst']:6.2f} s, "
                  f"all done {a['last']:6.2f} s | B beside enum  decode mean {b['mean']:6.2f} s, "
                  f"worst {b['worst']:6.2f} s, all done {b['last']:6.2f} s | "
                  f"B/A decode {b['mean'] / a['mean']:.2f}, all done {b['last'] / a['last']:.2f} "
                  f"(enum tokens by then: {b['enum_tokens']}) | process CPU A {a['cpu']:.1f} s, B {b['cpu']:.1f} s, "
                  f"of which B's sampling thread {b['sampling_cpu']:.1f} s")
    print(f"plain decode time beside the enum / alone: median ratio {pairs.median():.2f} "
          f"over {len(pairs.ratios)} pairs (target <= 2)")


if __name__ == "__main__":
    main()
