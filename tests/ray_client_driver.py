"""`python tests/ray_client_driver.py ADDRESS LINES MODEL`: a Ray pool driven over the Ray client
(ray://ADDRESS), 2 workers on the "slow" fake runner, for tests/test_ray_client_disconnect.py.

It submits LINES lines, says `answered N` on stdout once a few are answered (the test then cuts
the connection), reads a line on stdin (the test has restored it), says `answered N` again,
then waits for every line and prints one JSON object: each line's outcome, the pool's summary
and its notes. Each note also goes to stderr as it comes (the test waits for the loss to be
said instead of sleeping past it). A process of its own: the Ray client's session is not the
test process's.
"""
from __future__ import annotations

import json
import sys
import time

from llamabatch import EngineConfig, SamplingParams
from llamabatch.cluster.pool import RayPool, RayStartError
from supervised_child_runner import choice


FLAKES = ("Starting Ray client server failed", "Initialization failure from server")


def start(address: str, model: str, notes: list[str]) -> RayPool:
    for attempt in (1, 2, 3):
        try:
            return RayPool.start(EngineConfig(model=model, n_parallel=2, n_ctx=1024),
                                 SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), address=address,
                                 workers=2, cpus_per_worker=1, gpus_per_worker=0, runner=choice("slow"),
                                 note=lambda line: (notes.append(line), print(line, file=sys.stderr, flush=True)))
        except RayStartError as exc:  # Ray's client server now and then fails to start a session on a loaded machine
            if not any(flake in str(exc) for flake in FLAKES) or attempt == 3:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def main(address: str, n: int, model: str) -> None:
    notes: list[str] = []
    pool = start(address, model, notes)
    try:
        handles = [pool.submit(f"line {i}") for i in range(n)]
        while sum(h.done for h in handles) < 6:
            time.sleep(0.05)
        print("answered", sum(h.done for h in handles), flush=True)
        sys.stdin.readline()
        print("answered", sum(h.done for h in handles), flush=True)
        results = [h.result(timeout=180) for h in handles]
        print(json.dumps({"outcomes": [[r.finish_reason, r.error_code] for r in results],
                          "summary": pool.summary_lines(), "notes": notes}), flush=True)
    finally:
        pool.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
