"""`serve-stdin` with 4 concurrent clients sending requests of varied length into 8 slots:
generated tokens per second, today's defaults against a stream per slot with slot moves off
(what serve-stdin ran before it kept its busy slots consecutive), and one shared cache.

Each client sends a request, waits for its `done`, and sends its next one, so at most 4 of the 8
slots are busy and requests end at different times (the holes slot moves fill). Requests: prompts
of 10 to about 400 tokens and answers of 8-256 tokens (ignore_eos, greedy), the same in every arm.
Arms, alternating A B C each round:
  A  serve-stdin with default settings
  B  `--no-kv-unified --no-slot-moves`
  C  `--kv-unified`
Timed from the first request written to the last `done` read (the model's load is not counted).

Usage: python benchmarks/serve_stdin_clients.py [--clients 4] [--requests 12] [--rounds 2] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import time

from _bench import Pairs, essay_prompts, llamabatch_command, machine_line, model_path, say, sky_prompts

ARMS = {"A": [], "B": ["--no-kv-unified", "--no-slot-moves"], "C": ["--kv-unified"]}
SLOTS = 8


def client_requests(clients: int, per_client: int, seed: int = 11) -> list[list[dict]]:
    """Each client's requests, in order: prompts of varied length, answers of 8-256 tokens."""
    rng = random.Random(seed)
    n = clients * per_client
    short, essays = sky_prompts(n), essay_prompts(n)
    requests = []
    for i in range(n):
        # a third of the prompts carry a paragraph of context (a few hundred tokens)
        prompt = essays[i] + " ".join(short[(i + k) % n] for k in range(rng.randint(4, 16))) if i % 3 == 0 \
            else short[i]
        requests.append({"id": f"r{i}", "prompt": prompt, "max_tokens": rng.randint(8, 256),
                         "temperature": 0, "ignore_eos": True})
    return [requests[c::clients] for c in range(clients)]


def serve_once(arm: str, model: str, threads: int, work: list[list[dict]]) -> tuple[float, int]:
    """(seconds from the first request to the last done, tokens generated)."""
    command = llamabatch_command("serve-stdin", "-m", model, "--threads", str(threads), "--n-parallel", str(SLOTS),
                                 "--n-ctx", str(SLOTS * 1024), "--prefix-store", "off", *ARMS[arm])
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready = json.loads(proc.stdout.readline())
        if ready.get("event") != "ready":
            raise SystemExit(f"arm {arm}: serve-stdin did not start: {ready}")
        owner, nexts = {}, [0] * len(work)

        def send(client: int) -> None:
            request = work[client][nexts[client]]
            nexts[client] += 1
            owner[request["id"]] = client
            proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]

        t0 = time.perf_counter()
        for client in range(len(work)):
            send(client)
        pending, generated = sum(len(w) for w in work), 0
        while pending:
            event = json.loads(proc.stdout.readline())
            if event.get("event") not in ("done", "error"):
                continue
            if event["event"] == "error":
                raise SystemExit(f"arm {arm}: request failed: {event}")
            generated += event["usage"]["completion_tokens"]
            pending -= 1
            client = owner.pop(event["id"])
            if nexts[client] < len(work[client]):
                send(client)
        return time.perf_counter() - t0, generated
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=12, help="requests per client (default 12)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-m", "--model", default=None)
    args = ap.parse_args()
    model = model_path(args.model)
    work = client_requests(args.clients, args.requests)
    say(f"# serve-stdin, {args.clients} clients x {args.requests} requests into {SLOTS} slots, {args.threads} "
        f"threads; {machine_line(model)}")
    print("| round | A default (tok/s) | B streams, moves off (tok/s) | C one shared cache (tok/s) | A/B | C/B |")
    print("|---|---|---|---|---|---|")
    a_over_b, c_over_b = Pairs(), Pairs()
    for r in range(1, args.rounds + 1):
        rate = {}
        for arm in ARMS:
            seconds, generated = serve_once(arm, model, args.threads, work)
            rate[arm] = generated / seconds
        ab, cb = a_over_b.add(rate["B"], rate["A"]), c_over_b.add(rate["B"], rate["C"])
        print(f"| {r} | {rate['A']:.1f} | {rate['B']:.1f} | {rate['C']:.1f} | {ab:.3f} | {cb:.3f} |", flush=True)
    print(f"\nmedian A/B {a_over_b.median():.3f} (target >= 1.3), C/B {c_over_b.median():.3f}")


if __name__ == "__main__":
    main()
