"""Mixed ticks with a KV stream per slot: how many graph runs a tick that carries prompt chunks
beside decode rows takes on workload (c) of vs_llama_server.py (24 distinct prompts of 10-1,500
tokens, 32 tokens each, 8 slots), and what share of the decode time those ticks hold.

llama.cpp's split_equal takes the same number of rows from each consecutive sequence per graph
run, so a mixed tick is at least two runs (the decode rows with one row of each chunk, then the
rest of the chunks), and one more for each further chunk length. What a reshaping of such ticks
could save at most is the extra runs times the fixed cost of a graph run (the weights read once
more): printed beside the mixed ticks' own time. Graph runs are counted by llama.cpp's split
mirrored in kernel_paths/ubatch_split.py (TickRecord.ubatches), so they do not depend on load.

Usage: python benchmarks/mixed_ticks.py [--threads 2] [--run-ms 10]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from _bench import machine_line, model_path, say
from vs_llama_server import workloads

from llamabatch import Engine, EngineConfig, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run-ms", type=float, default=10.0,
                    help="the fixed cost of one more graph run, ms (docs/performance.md, Moves: 10 ms quiet)")
    ap.add_argument("-m", "--model", default=None)
    args = ap.parse_args()
    model = model_path(args.model)
    say(f"# mixed ticks on workload (c), a KV stream per slot, 8 slots, {args.threads} threads; {machine_line(model)}")
    engine = Engine(EngineConfig(model=model, n_parallel=8, n_ctx=8 * 2048, threads=args.threads, kv_unified=False))
    ticks: list = []
    engine.subscribe(lambda r: ticks.append(r) if getattr(r, "kind", "") == "tick" else None)
    try:
        work = workloads(engine.tokenize, "c")[0]
        t0 = time.perf_counter()
        engine.generate(work.prompts, SamplingParams(max_tokens=work.max_tokens, temperature=0, ignore_eos=True))
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    mixed = [t for t in ticks if t.prefill_tokens and t.decode_tokens]
    extra = sum(t.ubatches - 2 for t in mixed)
    mixed_ms = sum(t.eval_ms for t in mixed)
    print(f"| ticks | mixed ticks | graph runs a mixed tick (mean) | runs per mixed tick: count | "
          f"decode ms in mixed ticks | of all decode ms | runs beyond 2 | at {args.run_ms:g} ms a run |")
    print("|---|---|---|---|---|---|---|---|")
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(Counter(t.ubatches for t in mixed).items()))
    print(f"| {len(ticks)} | {len(mixed)} | {statistics.mean(t.ubatches for t in mixed):.2f} | {counts} | "
          f"{mixed_ms:,.0f} | {mixed_ms / sum(t.eval_ms for t in ticks):.0%} | {extra} | "
          f"{extra * args.run_ms:,.0f} ms of {wall * 1000:,.0f} ({extra * args.run_ms / (wall * 1000):.1%}) |")


if __name__ == "__main__":
    main()
