"""What probes and scrapes cost `llamabatch serve`, each as paired A B A B runs with ratios.

    python benchmarks/serve_probes.py [--lines 400] [--tokens 16] [--slots 8] [--threads 2] [--no-isolate]
                                      [-m MODEL] [--rounds 2] [--probe-every 0.1] [--scrape-every 1.0]

After one warm-up batch, per round, on one server (the engine in a supervised child unless --no-isolate, one KV cache its
slots share, as `serve` opens it):

1. The batch alone (A), then the same batch while GET /metrics is scraped every --scrape-every
   seconds (B): ratio B/A of wall time (target <= 1.01). Each scrape is parsed with
   prometheus_client's own parser, so a malformed page stops the benchmark.
2. Through both runs, GET /health every --probe-every seconds on a connection of its own: the
   50th and 99th percentile and the slowest answer, while the batch keeps every slot busy
   (target p99 < 5 ms).

Measures and prints; asserts nothing on time.
"""
from __future__ import annotations

import argparse
import http.client
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from _bench import Pairs, machine_line, model_path, served
from serve_batches import through_server, write_batch


class Every:
    """Call `fn` every `period` seconds on a thread of its own until stop(); each call's seconds kept."""

    def __init__(self, period: float, fn: Callable[[], None]):
        self.period, self.fn = period, fn
        self.took: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            started = time.perf_counter()
            self.fn()
            self.took.append(time.perf_counter() - started)
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.perf_counter()))

    def __enter__(self) -> "Every":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def getter(port: int, path: str, check: Callable[[int, bytes], None]) -> Callable[[], None]:
    """GET `path` on one kept-alive connection, as a probe or a scraper holds one."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def get() -> None:
        conn.request("GET", path)
        answer = conn.getresponse()
        check(answer.status, answer.read())
    return get


def health_ok(status: int, body: bytes) -> None:
    if status != 200:
        raise SystemExit(f"/health answered {status}: {body[:200]!r}")


def metrics_parse(status: int, body: bytes) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    if status != 200:
        raise SystemExit(f"/metrics answered {status}: {body[:200]!r}")
    if not any(f.name.startswith("llamabatch") for f in text_string_to_metric_families(body.decode())):
        raise SystemExit("/metrics holds no llamabatch figures")


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--probe-every", type=float, default=0.1, help="seconds between /health probes")
    parser.add_argument("--scrape-every", type=float, default=1.0, help="seconds between /metrics scrapes")
    parser.add_argument("--no-isolate", dest="isolate", action="store_false")
    parser.add_argument("-m", "--model", default=None)
    args = parser.parse_args()

    from llamabatch import EngineConfig, SamplingParams
    from llamabatch.engines import open_engine

    model = model_path(args.model)
    config = EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots, threads=args.threads,
                          kv_unified=True)
    engine = open_engine(config, SamplingParams(temperature=0, max_tokens=args.tokens), isolated=args.isolate)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with served(engine, str(workdir / "data")) as (client, port):
            rounds(args, client, port, write_batch(workdir / "batch.jsonl", args.lines, args.tokens),
                   f"{args.lines} lines x {args.tokens} tokens, {args.slots} slots (one KV cache), {args.threads} "
                   f"threads, {os.path.basename(model)}, {'supervised child' if args.isolate else 'in-process engine'}; "
                   f"/health every {args.probe_every} s, /metrics every {args.scrape_every} s; {machine_line(model)}")


def rounds(args: argparse.Namespace, client: Any, port: int, path: Path, header: str) -> None:
    """A warm-up batch, then --rounds pairs: the batch alone, then scraped; /health probed throughout."""
    print(header)
    scraped = Pairs()
    probes: list[float] = []
    through_server(client, path, args.lines)  # warm-up: the first batch pays for loading pages and graphs
    for r in range(1, args.rounds + 1):
        with Every(args.probe_every, getter(port, "/health", health_ok)) as probe:
            alone = through_server(client, path, args.lines)
            with Every(args.scrape_every, getter(port, "/metrics", metrics_parse)) as scrape:
                with_scrapes = through_server(client, path, args.lines)
        probes += probe.took
        ratio = scraped.add(alone, with_scrapes)
        print(f"round {r}: batch alone {alone:.2f} s, scraped {len(scrape.took)} times {with_scrapes:.2f} s "
              f"-> {ratio:.3f}x; /health: {len(probe.took)} probes, p50 {percentile(probe.took, 50) * 1000:.2f} "
              f"ms, p99 {percentile(probe.took, 99) * 1000:.2f} ms, slowest {max(probe.took) * 1000:.2f} ms")
    print(f"median: scraped / alone {scraped.median():.3f}x over {len(scraped.ratios)} pairs "
          f"({', '.join(f'{x:.3f}' for x in scraped.ratios)}) (target <= 1.01); /health over {len(probes)} "
          f"probes: p99 {percentile(probes, 99) * 1000:.2f} ms (target < 5 ms)")


if __name__ == "__main__":
    main()
