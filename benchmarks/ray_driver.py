"""What one Ray driver (the process running `run --ray` or `serve --ray`) can hand out and collect:
lines per second through the Ray pool to many fake-runner actors, the driver's CPU per line,
and the bytes each line costs on the wire.

    python benchmarks/ray_driver.py [--actors 16] [--lines 4000] [--line-bytes 200] [--rounds 2]

A local Ray instance with one logical CPU per actor; every actor runs the scripted fake runner
(tests/fake_runner.py at 5 ms a step: no model, so the engines are never the limit) with 8
slots. The driver submits `--lines` prompts of `--line-bytes` bytes as JSONL lines
({"prompt": ...}) through RayPool.submit, at most the pool's in-flight cap outstanding (what
run's reader keeps), each answered with one token, and times first submit to last answer.
Driver CPU is this process's own (its threads and Ray's core worker threads), so
1000 / (CPU ms per line) is what one driver core can sustain with the engines anywhere else;
Ray's CPU is that of every process the local instance runs (the actors, raylet, GCS: this
process's descendants, read from /proc), which shares the machine's cores with the driver here.
Bytes per line: what a worker's take() (or put()) carries of it, pickled. Measures only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from _bench import machine_line, say

TESTS = str(Path(__file__).resolve().parent.parent / "tests")


def prompt_of(size: int, i: int) -> str:
    """A prompt whose JSONL line {"prompt": ...} is `size` bytes."""
    head = f"line {i}: "
    room = size - len(json.dumps({"prompt": head}))
    return head + ("lorem ipsum dolor sit amet " * (room // 27 + 1))[:max(room, 0)]


def descendants_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of every living descendant of process `root`, from /proc."""
    parent, cpu = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parent[int(name)] = int(fields[1])
        cpu[int(name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    found, todo = set(), [root]
    while todo:
        here = todo.pop()
        for pid, ppid in parent.items():
            if ppid == here and pid not in found:
                found.add(pid)
                todo.append(pid)
    return sum(cpu[pid] for pid in found)


def wire_bytes(pool, key: int, prompt: str, params, result) -> tuple[int, int]:
    """Pickled sizes of one line as a worker's put() gets it and of its (key, Result) as take()
    returns it (several lines share a call; Ray's own framing per call is not counted)."""
    import ray.cloudpickle as pickle

    return len(pickle.dumps((key, prompt, pool.on_the_wire(params)))), len(pickle.dumps((key, result)))


def one_round(pool, params, prompts: list[str]) -> tuple[float, float, float, list]:
    """Wall, driver-CPU and Ray's processes' CPU seconds to hand every prompt out and collect its answer."""
    room = threading.BoundedSemaphore(pool.inflight_cap)
    done = threading.Event()
    left = [len(prompts)]
    results: list = []
    lock = threading.Lock()

    def answered(_handle, event) -> None:
        if type(event).__name__ != "Result":
            return
        room.release()
        with lock:
            results.append(event)
            left[0] -= 1
            if left[0] == 0:
                done.set()

    wall, cpu, ray_cpu = time.perf_counter(), time.process_time(), descendants_cpu_s(os.getpid())
    for prompt in prompts:
        room.acquire()
        pool.submit(prompt, params, stream=False, callback=answered)
    done.wait()
    return (time.perf_counter() - wall, time.process_time() - cpu, descendants_cpu_s(os.getpid()) - ray_cpu,
            results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=16, help="Ray actors, one engine each (default 16)")
    ap.add_argument("--lines", type=int, default=4000, help="lines per round (default 4000)")
    ap.add_argument("--line-bytes", type=int, default=200, help="bytes per JSONL line (default 200)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds after a warm-up (default 2)")
    a = ap.parse_args()
    # the actors import the fake runner by module name (tests/supervised_child_runner.py)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    sys.path.insert(0, TESTS)
    import ray
    from supervised_child_runner import choice

    from llamabatch import EngineConfig, SamplingParams
    from llamabatch.cluster.pool import RayPool

    ray.init(address="local", num_cpus=a.actors, include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = EngineConfig(model="fake.gguf", n_parallel=8, n_ctx=8 * 512, prefix_store=None)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    started = time.perf_counter()
    pool = RayPool.start(config, params, address=None, workers=a.actors, cpus_per_worker=1, gpus_per_worker=0.0,
                         runner=choice("fake"), watchdog_s=0)
    say(f"{a.actors} actors started in {time.perf_counter() - started:.1f}s")
    print(f"{a.actors} fake-runner actors x 8 slots on a local Ray instance, {a.lines} lines of {a.line_bytes} "
          f"bytes a round, 1 token each; {machine_line()}")
    try:
        prompts = [prompt_of(a.line_bytes, i) for i in range(a.lines)]
        one_round(pool, params, prompts[: a.lines // 4])  # warm-up: every actor's threads and Ray's connections
        for r in range(a.rounds):
            wall, cpu, ray_cpu, results = one_round(pool, params, prompts)
            print(f"round {r + 1}: {a.lines / wall:7.0f} lines/s handed out and collected ({wall:.2f}s wall); "
                  f"driver CPU {cpu / a.lines * 1000:.3f} ms/line (one driver core: {a.lines / cpu:.0f} lines/s); "
                  f"Ray's processes' CPU {ray_cpu / a.lines * 1000:.3f} ms/line; load {os.getloadavg()[0]:.1f}")
        out, back = wire_bytes(pool, 0, prompts[-1], params, results[-1])
        print(f"on the wire per line (pickled): {out} bytes out (key, prompt; params equal to the defaults are not "
              f"sent), {back} bytes back (key, Result)")
    finally:
        pool.close()


if __name__ == "__main__":
    main()
