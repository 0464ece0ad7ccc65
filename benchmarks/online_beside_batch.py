"""A batch of one-length lines beside an urgent chat each second, on each KV layout, in one process.

    python benchmarks/online_beside_batch.py [--lines 200] [--tokens 16] [--slots 8] [--rounds 3]
                                             [--threads 2] [--idle-chats 5] [-m MODEL]

Two engines in this process, one with a KV stream per slot (the default of `run`) and one with
one cache shared by the slots (`kv_unified`, the default of `serve`). Each round runs,
alternating: the batch alone on streams, the batch with online traffic on streams, then the same
two on the unified cache. The batch is `Engine.generate` over --lines essay prompts of exactly
--tokens tokens; the online traffic is one chat of 8 tokens at priority -1, the next one a
second after the last ended, as `benchmarks/serve_batches.py` sends through the server. Before
the rounds, each engine answers --idle-chats chats alone: their median time to first token is
"idle".

Printed per round: each run's wall time, its chats' time to first token over idle (median and
the largest), and ticks by kind (decode only, mixed prompt and decode, prefill only, stopped
for an urgent arrival: count, seconds, graph runs per tick); per pair, the batch alone over the
batch with online traffic (what serve_batches.py's target of >= 0.9 asks of `serve`) beside
the floor the chats' own work sets. The floor: each chat costs the batch at least its prompt's
tick (the idle first-token time: a tick that keeps the first token near idle carries no batch
row) and its 7 decode rows (a slot's share of 7 of the alone run's decode ticks), so the batch
alone over the batch with online traffic is at most alone / (alone + chats x that). At the
end, per layout: those ratios per pair and the chats' first-token times over idle (median and
p95 over every round), and the unified cache's wall over the streams'.

Measures and prints; asserts nothing on time.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from _bench import Pairs, TickLog, essay_prompts, machine_line, model_path, p95, tick_kinds


def chat(engine: Any, n: int) -> Any:
    """One urgent chat of 8 tokens, its result. The number leads, so a chat reuses no more of
    the last one's KV than the template's first tokens, idle or beside the batch."""
    from llamabatch import SamplingParams

    return engine.submit([{"role": "user", "content": f"{n}: name a colour."}],
                         SamplingParams(temperature=0, max_tokens=8, priority=-1)).result()


def run_batch(engine: Any, log: TickLog, args: argparse.Namespace, online: bool) -> tuple[float, list[float], list[Any]]:
    """The batch's wall seconds, the online chats' times to first token (ms), its tick records."""
    from llamabatch import SamplingParams

    log.take()
    stop, ttfts = threading.Event(), []

    def sender() -> None:
        while not stop.wait(1.0):
            ttfts.append(chat(engine, len(ttfts)).timings.ttft_ms)

    thread = threading.Thread(target=sender)
    if online:
        thread.start()
    start = time.perf_counter()
    engine.generate(essay_prompts(args.lines), SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True))
    wall = time.perf_counter() - start
    stop.set()
    if online:
        thread.join()
    return wall, ttfts, log.take()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16, help="tokens each line generates (default 16)")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--idle-chats", type=int, default=5, help="chats on each idle engine for the idle first-token time")
    ap.add_argument("-m", "--model", default=None, help="model (default: the bundled Gemma 3 270M)")
    args = ap.parse_args()

    from llamabatch import Engine, EngineConfig

    model = model_path(args.model)
    engines, logs = {}, {}
    for layout in ("streams", "unified"):
        engines[layout] = Engine(EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots,
                                              threads=args.threads, kv_unified=layout == "unified"))
        logs[layout] = TickLog(engines[layout])
    print(f"{args.lines} lines x {args.tokens} tokens, {args.slots} slots, {args.threads} threads, "
          f"engine in-process; {machine_line(model)}")
    kept, floors = {layout: Pairs() for layout in engines}, {layout: [] for layout in engines}
    unified_over_streams = {False: Pairs(), True: Pairs()}
    slowdown: dict[str, list[float]] = {layout: [] for layout in engines}
    try:
        idle = {}
        for layout, engine in engines.items():  # warm-up: the weights paged in, the template cached
            run_batch(engine, logs[layout], argparse.Namespace(lines=args.slots, tokens=2), online=False)
            chat(engine, -1)
            idle[layout] = statistics.median(chat(engine, n).timings.ttft_ms for n in range(args.idle_chats))
            print(f"{layout}: an urgent chat's time to first token on the idle engine, median of "
                  f"{args.idle_chats}: {idle[layout]:.0f} ms")
        for r in range(1, args.rounds + 1):
            walls = {}
            for layout, engine in engines.items():
                for online in (False, True):
                    wall, ttfts, ticks = run_batch(engine, logs[layout], args, online)
                    walls[layout, online] = wall
                    if not online:
                        decode_s = [t.wall_ms / 1000 for t in ticks if t.decode_tokens and not t.prefill_tokens]
                        decode_tick = statistics.mean(decode_s) if decode_s else 0.0
                    over = [t / idle[layout] for t in ttfts]
                    slowdown[layout] += over
                    print(f"round {r} {layout:8} {'online' if online else 'alone '} {wall:6.2f} s"
                          + (f" ({len(ttfts)} chats, first token / idle median {statistics.median(over):.2f} "
                             f"max {max(over):.2f}; {sum(t.preemptions for t in ticks)} lines put aside)"
                             if ttfts else "")
                          + f": {tick_kinds(ticks)}")
                chats = len(ttfts)
                floor = walls[layout, False] / (walls[layout, False]
                                                + chats * (idle[layout] / 1000 + 7 * decode_tick / args.slots))
                floors[layout].append(floor)
                ratio = kept[layout].add(walls[layout, True], walls[layout, False])
                print(f"round {r} {layout:8} alone / online {ratio:.3f} (the chats' own work allows at most {floor:.3f})")
            for online in (False, True):
                unified_over_streams[online].add(walls["streams", online], walls["unified", online])
        for layout in engines:
            print(f"{layout}: the batch alone over the batch with online traffic, per pair "
                  f"{', '.join(f'{x:.3f}' for x in kept[layout].ratios)} (median {kept[layout].median():.3f}; "
                  f"floor {', '.join(f'{x:.3f}' for x in floors[layout])}); first token / idle over "
                  f"{len(slowdown[layout])} chats: median {statistics.median(slowdown[layout]):.2f}, "
                  f"p95 {p95(slowdown[layout]):.2f}")
        for online in (False, True):
            print(f"unified wall / streams wall, {'with online traffic' if online else 'batch alone'}: "
                  f"{', '.join(f'{x:.3f}' for x in unified_over_streams[online].ratios)}")
    finally:
        for engine in engines.values():
            engine.close()


if __name__ == "__main__":
    main()
