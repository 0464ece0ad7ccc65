"""A batch of one-length lines beside an urgent chat each second, on each KV layout, in one process.

    python benchmarks/online_beside_batch.py [--lines 200] [--tokens 16] [--slots 8] [--rounds 3]
                                             [--threads 2] [-m MODEL]

Two engines in this process, one with a KV stream per slot (the default) and one with one
cache shared by the slots (`kv_unified`). Each round runs, alternating: the batch alone on
streams, the batch with online traffic on streams, then the same two on the unified cache. The
batch is `Engine.generate` over --lines essay prompts of exactly --tokens tokens; the online
traffic is one chat of 8 tokens at priority -1, the next one a second after the last ended, as
`benchmarks/serve_batches.py` sends through the server. Printed per round: each run's wall time
and ticks by kind (decode only, mixed prompt and decode, prefill only, stopped for an urgent
arrival: count, seconds, graph runs per tick); per pair, the batch alone over the batch with
online traffic (what serve_batches.py's target of >= 0.9 asks of `serve`), and the unified
cache's wall over the streams'.

Measures and prints; asserts nothing on time.
"""
from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from _bench import Pairs, essay_prompts, machine_line, model_path


def tick_kinds(ticks: list[Any]) -> str:
    """The ticks by kind as `bench --verbose` groups them (llamabatch/bench/trace.py), and apart
    from them the decodes stopped for an urgent arrival (nothing of them was kept)."""
    from llamabatch.bench.trace import trace_figures

    figures = trace_figures([r.to_dict() for r in ticks if not r.interrupted])
    parts = [f"{kind} {row['ticks']:.0f} ticks {row['ticks'] * row['mean_wall_ms'] / 1000:.2f} s "
             f"{row['mean_ubatches']:.2f} runs" for kind, row in figures.items() if kind != "all"]
    stopped = [r for r in ticks if r.interrupted]
    if stopped:
        parts.append(f"stopped {len(stopped)} ticks {sum(r.wall_ms for r in stopped) / 1000:.2f} s")
    return "; ".join(parts)


def run_batch(engine: Any, ticks: list[Any], args: argparse.Namespace, online: bool) -> tuple[float, int, int]:
    """The batch's wall seconds, online requests answered, lines put aside."""
    from llamabatch import SamplingParams

    ticks.clear()
    stop, asked = threading.Event(), [0]

    def sender() -> None:
        while not stop.wait(1.0):
            engine.submit([{"role": "user", "content": f"Name a colour ({asked[0]})."}],
                          SamplingParams(temperature=0, max_tokens=8, priority=-1)).result()
            asked[0] += 1

    thread = threading.Thread(target=sender)
    if online:
        thread.start()
    start = time.perf_counter()
    engine.generate(essay_prompts(args.lines), SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True))
    wall = time.perf_counter() - start
    stop.set()
    if online:
        thread.join()
    return wall, asked[0], sum(r.preemptions for r in ticks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16, help="tokens each line generates (default 16)")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-m", "--model", default=None, help="model (default: the bundled Gemma 3 270M)")
    args = ap.parse_args()

    from llamabatch import Engine, EngineConfig

    model = model_path(args.model)
    engines, ticks = {}, {}
    for layout in ("streams", "unified"):
        engines[layout] = Engine(EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots,
                                              threads=args.threads, kv_unified=layout == "unified"))
        ticks[layout] = []
        engines[layout].subscribe(lambda r, into=ticks[layout]: into.append(r) if getattr(r, "kind", "") == "tick" else None)
    print(f"{args.lines} lines x {args.tokens} tokens, {args.slots} slots, {args.threads} threads, "
          f"engine in-process; {machine_line(model)}")
    kept = {layout: Pairs() for layout in engines}
    unified_over_streams = {False: Pairs(), True: Pairs()}
    try:
        for layout, engine in engines.items():  # warm-up: the weights paged in, the template cached
            run_batch(engine, ticks[layout], argparse.Namespace(lines=args.slots, tokens=2), online=False)
        for r in range(1, args.rounds + 1):
            walls = {}
            for layout, engine in engines.items():
                for online in (False, True):
                    wall, answered, parked = run_batch(engine, ticks[layout], args, online)
                    walls[layout, online] = wall
                    print(f"round {r} {layout:8} {'online' if online else 'alone '} {wall:6.2f} s"
                          + (f" ({answered} online, {parked} lines put aside)" if online else "")
                          + f": {tick_kinds(ticks[layout])}")
                ratio = kept[layout].add(walls[layout, True], walls[layout, False])
                print(f"round {r} {layout:8} alone / online {ratio:.3f}")
            for online in (False, True):
                unified_over_streams[online].add(walls["streams", online], walls["unified", online])
        for layout in engines:
            print(f"{layout}: the batch alone over the batch with online traffic, per pair "
                  f"{', '.join(f'{x:.3f}' for x in kept[layout].ratios)} (median {kept[layout].median():.3f})")
        for online in (False, True):
            print(f"unified wall / streams wall, {'with online traffic' if online else 'batch alone'}: "
                  f"{', '.join(f'{x:.3f}' for x in unified_over_streams[online].ratios)}")
    finally:
        for engine in engines.values():
            engine.close()


if __name__ == "__main__":
    main()
