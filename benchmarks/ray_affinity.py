"""Prefix affinity on `serve --ray`'s pool: prompt tokens served from the workers' caches in
multi-turn chats with affinity on and off, on the bundled model.

    python benchmarks/ray_affinity.py [--workers 2] [--chats 6] [--turns 5] [--max-tokens 16]

A local Ray instance with one CPU per worker; each side starts its own pool (2 workers x 1
thread x 4 slots, no disk prefix store, so only what a worker's slots hold counts). The chats
run at once, one thread each, every turn an online request (one priority step above a batch
line) whose messages are every earlier turn, its answers included, and the next question,
after a random pause (people read and type; chats in lock step would land on the same
worker every turn without affinity too); each side asks other questions of the same system
prompt, so neither finds the other's conversations. Prints each side's cached / prompt
tokens and the ratio of cached tokens (affinity on / off). Measures only.
"""
from __future__ import annotations

import argparse
import os
import random
import threading
import time

from _bench import machine_line, say

SYSTEM = ("You are a patient tutor. Answer every question in one short sentence, plainly, without lists, "
          "and stay on the topic the student chose at the start.")
TOPICS = ["rivers", "volcanoes", "bees", "comets", "glaciers", "deserts", "tides", "forests"]


def chat(pool, params, topic: str, turns: int, think_s: float, seed: int, totals: list, lock: threading.Lock) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    pause = random.Random(seed)
    for i in range(turns):
        time.sleep(pause.uniform(0, think_s))  # people read and type: chats do not move in step
        messages.append({"role": "user", "content": f"Question {i + 1} about {topic}: tell me one more fact."})
        result = pool.submit(list(messages), params, stream=False).result(timeout=600)
        messages.append({"role": "assistant", "content": result.text})
        with lock:
            totals[0] += result.usage.prompt_tokens
            totals[1] += result.usage.cached_tokens


def one_side(affinity: bool, a, topics: list[str]) -> tuple[int, int, float]:
    from llamabatch import EngineConfig, SamplingParams
    from llamabatch.cluster.pool import RayPool

    config = EngineConfig(n_parallel=4, n_ctx=4 * 2048, prefix_store=None)
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, priority=-1)  # serve's online priority
    pool = RayPool.start(config, SamplingParams(temperature=0.0), address=None, workers=a.workers,
                         cpus_per_worker=1, gpus_per_worker=0.0, prefix_affinity=affinity)
    totals, lock = [0, 0], threading.Lock()
    try:
        started = time.perf_counter()
        threads = [threading.Thread(target=chat, args=(pool, params, t, a.turns, a.think_s, k, totals, lock))
                   for k, t in enumerate(topics)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return totals[0], totals[1], time.perf_counter() - started
    finally:
        pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="Ray workers, one CPU each (default 2)")
    ap.add_argument("--chats", type=int, default=6, help="conversations at once (default 6)")
    ap.add_argument("--turns", type=int, default=5, help="turns per conversation (default 5)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default 16)")
    ap.add_argument("--think-s", type=float, default=1.0,
                    help="a pause before each turn, uniform from 0 to this, seeded per chat (default 1.0)")
    a = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    ray.init(address="local", num_cpus=a.workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"{a.chats} chats x {a.turns} turns at once, {a.max_tokens} tokens an answer, pauses of 0-{a.think_s:g}s, "
          f"on {a.workers} Ray workers x 1 thread x 4 slots; {machine_line()}")
    cached = {}
    try:
        for i, affinity in enumerate((False, True)):
            topics = [f"{TOPICS[k % len(TOPICS)]} (set {i + 1}, chat {k + 1})" for k in range(a.chats)]
            say(f"affinity {'on' if affinity else 'off'}: starting {a.workers} workers")
            prompt, hit, wall = one_side(affinity, a, topics)
            cached[affinity] = hit
            print(f"affinity {'on ' if affinity else 'off'}: {hit} of {prompt} prompt tokens cached "
                  f"({hit / max(prompt, 1):.1%}), {wall:.1f}s")
    finally:
        ray.shutdown()
    print(f"cached tokens, affinity on / off: {cached[True] / max(cached[False], 1):.2f}x")


if __name__ == "__main__":
    main()
