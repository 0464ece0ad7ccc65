"""`llamabatch run` locally vs `llamabatch run --ray` on this machine, on the same file.

    python benchmarks/ray_vs_local.py [--lines 48] [--tokens 48] [--rounds 2]

Local: one engine with 2 threads. Ray: a head started once for the whole benchmark (2 CPUs,
loopback), and `run --ray` with 2 workers x 1 CPU (1 thread each); the same slots per engine.
Runs alternate local, Ray, local, Ray ... and print each pair's throughput (completion
tokens / wall seconds, process start to exit) and ratio. The driver's cost per line is the
driver process's own CPU time (wait4 rusage: it starts no child processes when joining a
cluster) for the full file minus that of a 1-line run (start-up), per extra line.
Measures only; never asserts on time. The machine may be shared: read the per-pair ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from _bench import (completion_tokens, llamabatch_command, machine_line, read_records, workload_args,
                    write_prompt_lines)

# Its own workload (shorter than _bench.essay_prompts'), so its figures stay comparable with earlier runs.
TOPICS = ["a lighthouse keeper", "the history of bread", "a robot learning to paint", "volcanoes", "a chess match",
          "the moon landing", "a lost cat", "honeybees", "a train journey", "quantum computers", "an old library",
          "tides", "a jazz musician", "glaciers", "a small bakery", "desert plants"]


def write_input(path: Path, n: int, tokens: int) -> None:
    write_prompt_lines(path, [f"Here is a long essay about {TOPICS[i % len(TOPICS)]} (part {i // len(TOPICS) + 1}):\n\n"
                              for i in range(n)], tokens)


def timed_run(args: list[str], env: dict, out: Path, lines: int) -> tuple[int, float, float]:
    """Completion tokens, wall seconds, and the driver process's own CPU seconds."""
    if out.exists():
        out.unlink()
    start = time.perf_counter()
    proc = subprocess.Popen(llamabatch_command("run", *args, "-o", str(out), "-q"), env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"llamabatch run {' '.join(args)} exited {proc.returncode}")
    return completion_tokens(read_records(out, lines)), wall, usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(env: dict, tmp: Path, cpus: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port",
                             str(port), "--num-cpus", str(cpus), "--include-dashboard", "false", "--temp-dir",
                             str(tmp / "ray"), "--ray-client-server-port", str(free_port()),
                             "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", "--address", address], env=env,
                         capture_output=True).returncode != 0:
        if head.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the Ray head did not start")
        time.sleep(0.5)
    return head, address


@contextlib.contextmanager
def ray_head(cpus: int, prefix: str) -> Iterator[tuple[dict, Path, str]]:
    """A Ray head of `cpus` CPUs with token authentication in a scratch folder: (the environment
    to run llamabatch in, the folder, the head's address); stopped and removed after."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0")
    head, address = start_head(env, tmp, cpus)
    try:
        yield env, tmp, address
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=48, help="input lines (default 48)")
    workload_args(ap, tokens=48, slots=8, rounds=2)  # --slots: per engine, both sides
    a = ap.parse_args()

    with ray_head(2, "lbbench") as (env, tmp, address):
        inp, one = tmp / "in.jsonl", tmp / "one.jsonl"
        write_input(inp, a.lines, a.tokens)
        write_input(one, 1, a.tokens)
        engine = ["--n-parallel", str(a.slots), "--n-ctx", str(256 * a.slots)]
        local = [str(inp), *engine, "--threads", "2"]
        ray = ["--ray", address, "--ray-workers", "2", "--ray-cpus-per-worker", "1", *engine]
        print(f"{a.lines} lines x {a.tokens} tokens, {a.slots} slots per engine; local: 1 engine x 2 threads; "
              f"Ray: 2 workers x 1 thread on a 2-CPU head; {machine_line()}")
        pairs = []
        for r in range(a.rounds):
            lt, lw, _ = timed_run(local, env, tmp / "local.jsonl", a.lines)
            rt, rw, rcpu = timed_run([str(inp), *ray], env, tmp / "ray.jsonl", a.lines)
            pairs.append((lt / lw, rt / rw, rcpu))
            print(f"round {r + 1}: local {lt / lw:6.1f} tok/s ({lw:5.1f}s)   ray {rt / rw:6.1f} tok/s ({rw:5.1f}s)   "
                  f"ray/local {rt / rw / (lt / lw):.2f}")
        _, one_wall, one_cpu = timed_run([str(one), *ray], env, tmp / "one_out.jsonl", 1)  # not over its input
    per_line = [(cpu - one_cpu) / (a.lines - 1) * 1000 for _, _, cpu in pairs]
    local_mean = sum(p[0] for p in pairs) / len(pairs)
    ray_mean = sum(p[1] for p in pairs) / len(pairs)
    print(f"mean: local {local_mean:.1f} tok/s, ray {ray_mean:.1f} tok/s, ray/local {ray_mean / local_mean:.2f}")
    print(f"ray start-up (1-line run, end to end): {one_wall:.1f}s wall, driver CPU {one_cpu:.2f}s")
    print("driver CPU per line beyond start-up: " + ", ".join(f"{x:.2f} ms" for x in per_line)
          + f" (mean {sum(per_line) / len(per_line):.2f} ms/line)")

if __name__ == "__main__":
    main()
