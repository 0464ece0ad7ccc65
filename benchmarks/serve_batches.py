"""`llamabatch serve`'s targets, each as paired A B A B runs with ratios.

    python benchmarks/serve_batches.py [--lines 1000] [--tokens 16] [--slots 8] [--threads 2] [--no-isolate] [-m MODEL]
                                       [--online-slots 0] [--no-online-each-second | --online-only] [--vary-tokens] [--no-kv-unified] [--trace]
                                       [--rounds 2] [--rss-lines 10000 100000] [--skip-model] [--skip-rss]

1. Throughput: a --lines batch through the server (the openai SDK uploads the file, creates the
   batch, polls every 0.2 s and downloads the output) vs `llamabatch run`'s job on the same file
   and the same open engine (llamabatch.jobs.run_job, what the command runs once its engine is
   open): ratio = run's wall time / the server's (target >= 0.97). Every line generates exactly
   --tokens tokens (ignore_eos), or with --vary-tokens a length around it (the same mean). Then
   the same with one online chat request arriving every second
   (target >= 0.9; --no-online-each-second skips it, --online-only measures only this pair each
   round, for more pairs of it in the same time). Each run also prints this process's CPU
   seconds (client, server and batch lane, or `run`'s job), which share the cores with the
   engine's llama.cpp threads.
2. Online time to first token: 8 streamed chat requests one after another with no batch running
   vs while a --lines batch runs (the batch is cancelled after them): ratio = median TTFT with
   the batch / without (target <= 1.5).
3. Peak RSS: a server process on the scripted fake runner (tests/fake_runner.py) runs one batch of
   each --rss-lines size; its VmHWM (ratio largest / smallest, target <= 1.05).

Measures and prints; asserts nothing on time.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import Pairs, TickLog, essay_prompts, machine_line, model_path, say, tick_kinds

TESTS = str(Path(__file__).resolve().parent.parent / "tests")
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def write_batch(path: Path, n: int, tokens: int, vary: bool = False) -> Path:
    """n lines of exactly `tokens` tokens each, or with `vary` of tokens/2 to 3*tokens/2 (a fixed
    pattern, the same mean): lines of one length end together, so the slots' prompts are
    evaluated together; answers of many lengths, as real batches have, end one at a time."""
    prompts = essay_prompts(n)
    with open(path, "w") as f:
        for i, prompt in enumerate(prompts):
            length = tokens // 2 + (i * 7) % (tokens + 1) if vary else tokens
            body = {"model": "any", "prompt": prompt, "max_tokens": length, "temperature": 0, "ignore_eos": True}
            f.write(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": COMPLETIONS, "body": body}) + "\n")
    return path


def wait_ended(client: Any, batch_id: str, poll: float = 0.2) -> Any:
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(poll)


def through_server(client: Any, path: Path, lines: int) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        uploaded = client.files.create(file=(path.name, f), purpose="batch")
    batch = wait_ended(client, client.batches.create(input_file_id=uploaded.id, endpoint=COMPLETIONS,
                                                     completion_window="24h").id)
    text = client.files.content(batch.output_file_id).text
    wall = time.perf_counter() - start
    if batch.request_counts.completed != lines or text.count("\n") != lines:
        raise SystemExit(f"server batch: {batch.status} {batch.request_counts}")
    return wall


def through_run(engine: Any, path: Path, lines: int, workdir: Path) -> float:
    from llamabatch.jobs import run_job

    out = workdir / f"run-{time.monotonic_ns()}.jsonl"
    start = time.perf_counter()
    report = run_job(str(path), str(out), engine=engine, input_format="jsonl")
    wall = time.perf_counter() - start
    if report.ok != lines:
        raise SystemExit(f"run_job: {report.ok} ok of {lines}, {report.failed} failed")
    return wall


def through_server_with_online(client: Any, path: Path, lines: int) -> tuple[float, int]:
    """The batch through the server while one online chat request arrives every second:
    (the batch's wall seconds, online requests answered meanwhile)."""
    import threading

    stop, asked = threading.Event(), [0]

    def online() -> None:
        while not stop.wait(1.0):
            client.chat.completions.create(model="any", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": f"Name a colour ({asked[0]})."}])
            asked[0] += 1

    sender = threading.Thread(target=online)
    sender.start()
    try:
        wall = through_server(client, path, lines)
    finally:
        stop.set()
        sender.join()
    return wall, asked[0]


def cpu_timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """fn(*args) and the CPU seconds this process spent meanwhile, every thread (the openai
    client, the server and its batch lane, or `run`'s job): what the front end takes from the
    cores llama.cpp's threads run on (the engine's own child process is not counted)."""
    start = time.process_time()
    out = fn(*args)
    return out, time.process_time() - start


def ttft(client: Any, n: int = 8) -> float:
    """Median seconds to the first streamed content of n chat requests, one after another."""
    times = []
    for i in range(n):
        start = time.perf_counter()
        stream = client.chat.completions.create(model="any", stream=True, max_tokens=8, temperature=0,
                                                messages=[{"role": "user", "content": f"Name a colour ({i})."}])
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter() - start)
                break
        for _ in stream:
            pass
    return statistics.median(times)


def ttft_during_batch(client: Any, path: Path) -> float:
    with open(path, "rb") as f:
        uploaded = client.files.create(file=(path.name, f), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=COMPLETIONS, completion_window="24h")
    while client.batches.retrieve(batch.id).request_counts.completed < 1:
        time.sleep(0.05)
    seconds = ttft(client)
    if client.batches.retrieve(batch.id).status != "in_progress":
        raise SystemExit("the batch ended before the online requests did: give more --lines")
    client.batches.cancel(batch.id)
    wait_ended(client, batch.id)
    return seconds


def model_figures(args: argparse.Namespace) -> None:
    from openai import OpenAI

    from llamabatch import EngineConfig, SamplingParams
    from llamabatch.engines import open_engine
    from llamabatch.serve.http.app import build_app
    from llamabatch.serve.http.server import listen
    from llamabatch.serve.http.service import Service

    model = model_path(args.model)
    config = EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots, threads=args.threads,
                          kv_unified=args.kv_unified)
    params = SamplingParams(temperature=0, max_tokens=args.tokens)
    # as `llamabatch serve` runs it: llama.cpp in a supervised child unless --no-isolate, with
    # --online-slots on top of --slots; `run` opens its own engine of --slots
    engine = open_engine(config, params, isolated=args.isolate, extra_slots=args.online_slots)
    run_engine = open_engine(config, params, isolated=args.isolate) if args.online_slots else engine
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        service = Service(engine, str(workdir / "data"), online_slots=args.online_slots)
        listening = listen(build_app(service), "127.0.0.1", 0)
        service.start()
        thread = listening.run_in_thread()
        client = OpenAI(base_url=f"http://127.0.0.1:{listening.port}/v1", api_key="unused", max_retries=0,
                        timeout=3600)
        path = write_batch(workdir / "batch.jsonl", args.lines, args.tokens, args.vary_tokens)
        print(f"{args.lines} lines x {args.tokens} tokens{' on average' if args.vary_tokens else ''}, {args.slots} slots + {args.online_slots} for online "
              f"requests (--online-slots; `run`: {args.slots}), {args.threads} threads, {os.path.basename(model)}, "
              f"{'supervised child' if args.isolate else 'in-process engine'}, "
              f"{'one KV cache shared by the slots' if args.kv_unified else 'a KV stream per slot'}; "
              f"{machine_line(model)}")
        try:
            speed, first, shared = Pairs(), Pairs(), Pairs()
            # --trace: where each run's time went, by kind of tick
            logs = {e: TickLog(e) for e in {engine, run_engine}} if args.trace else {}

            def traced(e: Any) -> str:
                ticks = logs[e].take() if e in logs else []
                return f"\n  ticks: {tick_kinds(ticks)}" if ticks else ""

            for r in range(1, args.rounds + 1):
                if not args.online_only:
                    run_s, run_cpu = cpu_timed(through_run, run_engine, path, args.lines, workdir)
                    run_ticks = traced(run_engine)
                    server_s, server_cpu = cpu_timed(through_server, client, path, args.lines)
                    ratio = speed.add(server_s, run_s)
                    print(f"throughput round {r}: run {run_s:.2f} s, server {server_s:.2f} s -> server {ratio:.3f}x run "
                          f"(this process's CPU: run {run_cpu:.1f} s, server {server_cpu:.1f} s)"
                          f"{run_ticks}{traced(engine)}")
                if args.online_each_second:
                    run_s, run_cpu = cpu_timed(through_run, run_engine, path, args.lines, workdir)
                    run_ticks = traced(run_engine)
                    (busy_s, answered), busy_cpu = cpu_timed(through_server_with_online, client, path, args.lines)
                    ratio = shared.add(busy_s, run_s)
                    print(f"throughput with an online request each second, round {r}: run {run_s:.2f} s, server "
                          f"{busy_s:.2f} s ({answered} online answered) -> server {ratio:.3f}x run "
                          f"(this process's CPU: run {run_cpu:.1f} s, server {busy_cpu:.1f} s)"
                          f"{run_ticks}{traced(engine)}")
                if args.online_only:
                    continue
                idle, busy = ttft(client), ttft_during_batch(client, path)
                traced(engine)  # the first-token figure's ticks are not printed
                ratio = first.add(idle, busy)
                print(f"ttft round {r}: idle {idle * 1000:.0f} ms, during a batch {busy * 1000:.0f} ms -> {ratio:.2f}x")
            if speed.ratios:
                print(f"median: server {speed.median():.3f}x run (target >= 0.97); "
                      f"TTFT during a batch {first.median():.2f}x idle (target <= 1.5)")
            if shared.ratios:
                print(f"median: with an online request each second {shared.median():.3f}x run (target >= 0.9) over "
                      f"{len(shared.ratios)} pairs: {', '.join(f'{x:.3f}' for x in shared.ratios)}")
        finally:
            listening.stop()
            thread.join(10)
            service.close(30)
            engine.close()
            if run_engine is not engine:
                run_engine.close()


# -- peak RSS on the fake runner ----------------------------------------------------------------

def rss_child(data_dir: str) -> None:
    """The server process whose peak RSS is read: fake runner, port on stdout, until stdin closes."""
    sys.path.insert(0, TESTS)
    from fake_runner import FakeRunner
    from llamabatch import Engine, EngineConfig, SamplingParams
    from llamabatch.serve.http.app import build_app
    from llamabatch.serve.http.limits import UploadLimits
    from llamabatch.serve.http.server import listen
    from llamabatch.serve.http.service import Service

    runner = FakeRunner(n_slots=8, slot_ctx=256, n_batch=512)
    # the fake keeps every plan, sampler and trim it saw for tests to inspect: bounded here, so the
    # figure is the server's memory and not the fake's history
    for name in ("plans", "samplers", "trims", "jobs", "snapshots", "restores", "forks"):
        setattr(runner, name, collections.deque(maxlen=64))
    engine = Engine(EngineConfig(n_parallel=8, n_batch=512, chunk_size=64, n_ctx=8 * 256), runner=runner,
                    default_params=SamplingParams(temperature=0, max_tokens=4))
    service = Service(engine, data_dir, upload_limits=UploadLimits(max_bytes=10 ** 10, max_lines=10 ** 7))
    listening = listen(build_app(service), "127.0.0.1", 0)
    service.start()
    listening.run_in_thread()
    print(listening.port, flush=True)
    sys.stdin.read()
    listening.stop()
    service.close(30)
    engine.close()


def peak_rss(lines: int, workdir: Path) -> tuple[int, float]:
    from openai import OpenAI

    path = workdir / f"fake-{lines}.jsonl"
    with open(path, "w") as f:
        for i in range(lines):
            f.write(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": COMPLETIONS,
                                "body": {"prompt": f"question {i}"}}) + "\n")
    data = workdir / f"data-{lines}-{time.monotonic_ns()}"
    child = subprocess.Popen([sys.executable, __file__, "--rss-child", str(data)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{child.stdout.readline().strip()}/v1", api_key="unused",
                        max_retries=0, timeout=3600)
        start = time.perf_counter()
        with open(path, "rb") as f:
            uploaded = client.files.create(file=(path.name, f), purpose="batch")
        batch = wait_ended(client, client.batches.create(input_file_id=uploaded.id, endpoint=COMPLETIONS,
                                                         completion_window="24h").id, poll=0.5)
        wall = time.perf_counter() - start
        if batch.request_counts.completed != lines:
            raise SystemExit(f"fake batch of {lines}: {batch.status} {batch.request_counts}")
        with open(f"/proc/{child.pid}/status") as status:
            hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        return hwm, wall
    finally:
        child.stdin.close()
        child.wait(60)


def rss_figures(args: argparse.Namespace) -> None:
    small, large = min(args.rss_lines), max(args.rss_lines)
    print(f"peak RSS of the server process, fake runner (8 slots), one batch of {small:,} vs {large:,} lines; "
          f"{machine_line()}")
    pairs = Pairs()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, args.rounds + 1):
            (a, a_s), (b, b_s) = peak_rss(small, Path(tmp)), peak_rss(large, Path(tmp))
            ratio = pairs.add(a, b)
            print(f"rss round {r}: {small:,} lines {a / 1024:.1f} MiB ({a_s:.0f} s), {large:,} lines "
                  f"{b / 1024:.1f} MiB ({b_s:.0f} s) -> {ratio:.3f}x")
    print(f"median: peak RSS {pairs.median():.3f}x from {small:,} to {large:,} lines (target <= 1.05)")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1000, help="lines of the model batch (default 1000)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens each line generates (default 16)")
    ap.add_argument("--vary-tokens", action="store_true",
                    help="lines of --tokens/2 to 3x--tokens/2 tokens (the same mean) instead of all --tokens")
    ap.add_argument("--slots", type=int, default=8, help="engine slots (default 8)")
    ap.add_argument("--online-slots", type=int, default=0,
                    help="slots for online requests on top of --slots, as serve's flag (default 0)")
    ap.add_argument("--online-each-second", action=argparse.BooleanOptionalAction, default=True,
                    help="also the batch's throughput while an online request arrives every second (default on)")
    ap.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=True,
                    help="one KV cache shared by the slots, for both the server and run, as `llamabatch serve` "
                         "opens its engine (default); --no-kv-unified: a stream per slot, `run`'s default")
    ap.add_argument("--online-only", action="store_true",
                    help="each round only the pair for the online-each-second figure (run, then the server with "
                         "chats): more pairs of that figure in the same time")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument("--trace", action="store_true",
                    help="print each throughput run's ticks by kind (run's first, then the server's)")
    ap.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                    help="llama.cpp in a supervised child, as serve runs it (default); --no-isolate: in this process")
    ap.add_argument("-m", "--model", default=None, help="model (default: the bundled Gemma 3 270M)")
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs of each figure (default 2)")
    ap.add_argument("--rss-lines", type=int, nargs=2, default=[10_000, 100_000], help="the two fake batch sizes")
    ap.add_argument("--skip-model", action="store_true", help="only the fake-runner RSS figure")
    ap.add_argument("--skip-rss", action="store_true", help="only the model figures")
    args = ap.parse_args()
    if args.online_only and not args.online_each_second:
        ap.error("--online-only measures the online-each-second pair: not with --no-online-each-second")
    if not args.skip_model:
        model_figures(args)
    if not args.skip_rss:
        rss_figures(args)
    say("done")


if __name__ == "__main__":
    main()
