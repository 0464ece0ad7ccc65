"""A batch through `llamabatch serve --ray` against `llamabatch run --ray` on the same file and
the same workers' shape, on one Ray head of this machine.

    python benchmarks/serve_vs_run_ray.py [--lines 24] [--tokens 32] [--slots 4] [--rounds 2]

One Ray head (4 logical CPUs, loopback) for the whole benchmark. The server starts once with
2 workers x 1 CPU and stays up (its idle workers wait in take(), using no CPU); each `run
--ray` starts its own 2 workers x 1 CPU beside them. Rounds alternate run, serve, run, serve
... on the same OpenAI Batch file (/v1/completions, greedy, ignore_eos), and each side's figure
is its job manifest's generated_tok_s: generated tokens over the job's own wall time (Ray's
connect and the model loads are not in it for either side). Prints each pair's ratio
serve/run. Measures only; the machine may be shared: read the per-pair ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from _bench import llamabatch_command, machine_line, say
from ray_vs_local import TOPICS, ray_head

READY = re.compile(r"on http://127\.0\.0\.1:(\d+)/v1")


def write_batch(path: Path, n: int, tokens: int) -> bytes:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "any", "prompt": f"Here is a long essay about {TOPICS[i % len(TOPICS)]}:\n\n",
                       "max_tokens": tokens, "temperature": 0, "ignore_eos": True}} for i in range(n)]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    path.write_bytes(content)
    return content


def run_once(env: dict, inp: Path, out: Path, ray: list[str]) -> float:
    """`run --ray`'s generated tok/s, from its manifest."""
    for stale in (out, Path(f"{out}.manifest.json")):
        stale.unlink(missing_ok=True)
    proc = subprocess.run(llamabatch_command("run", str(inp), "-o", str(out), "-q", *ray), env=env)
    if proc.returncode != 0:
        raise SystemExit(f"llamabatch run exited {proc.returncode}")
    return json.loads(Path(f"{out}.manifest.json").read_text())["generated_tok_s"]


def start_server(env: dict, data: Path, ray: list[str]) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(llamabatch_command("serve", "--port", "0", "--data-dir", str(data), *ray), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        found = READY.search(line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(found.group(1))
    raise SystemExit(f"llamabatch serve exited {proc.wait()} before listening")


def serve_once(client, content: bytes, data: Path) -> float:
    """A batch through the server: its generated tok/s, from its manifest."""
    f = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    if batch.status != "completed" or batch.request_counts.failed:
        raise SystemExit(f"batch {batch.id}: {batch.status} {batch.request_counts}")
    manifest = next((data / "batches" / batch.id).glob("*.manifest.json"))
    return json.loads(manifest.read_text())["generated_tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=24, help="batch lines (default 24)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per line (default 32)")
    ap.add_argument("--slots", type=int, default=4, help="slots per worker (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="run, serve pairs (default 2)")
    a = ap.parse_args()
    from openai import OpenAI

    with ray_head(4, "lbsvr") as (env, tmp, address):
        inp = tmp / "in.jsonl"
        content = write_batch(inp, a.lines, a.tokens)
        ray = ["--ray", address, "--ray-workers", "2", "--ray-cpus-per-worker", "1", "--n-parallel", str(a.slots),
               "--n-ctx", str(256 * a.slots), "--prefix-store", "off",
               "--kv-unified"]  # serve's default KV layout, given to both: the same engines either side
        server = None
        try:
            server, port = start_server(env, tmp / "data", ray)
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=3600)
            print(f"{a.lines} lines x {a.tokens} tokens, 2 workers x 1 CPU x {a.slots} slots each side, on one Ray "
                  f"head of 4 logical CPUs; {machine_line()}")
            ratios = []
            for r in range(a.rounds):
                run_tok_s = run_once(env, inp, tmp / "run.jsonl", ray)
                serve_tok_s = serve_once(client, content, tmp / "data")
                ratios.append(serve_tok_s / run_tok_s)
                print(f"round {r + 1}: run --ray {run_tok_s:6.1f} tok/s   serve --ray {serve_tok_s:6.1f} tok/s   "
                      f"serve/run {ratios[-1]:.3f}")
                say(f"load average {os.getloadavg()[0]:.1f}")
            print("per-pair serve/run: " + ", ".join(f"{x:.3f}" for x in ratios))
        finally:
            if server is not None:
                server.send_signal(signal.SIGTERM)
                server.wait(60)

if __name__ == "__main__":
    main()
