"""`llamabatch serve --ray ADDRESS` on a local cluster of three raylets (ray.cluster_utils.Cluster,
1 CPU each, one per module) standing in for three nodes: batches and online requests through
the openai SDK, spread over the workers; a worker killed with SIGKILL, the server killed and
started again, and a poison line, every line answered exactly once; a conversation's next turn
over HTTP on the worker that ran its beginning. The server is
tests/fake_cli.py (the command line with a registered fake runner on every worker), so each
server start costs Ray's actor start-up, not a model load.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import fake_cli
from child_tools import child_env, fake_gguf
from http_server import CHAT, batch_file, batch_lines, ended, records, wait_batch
from lazy_modules import lazy
from supervised_child_runner import POISON

openai = lazy("openai")
# one xdist worker runs the module: its tests share one 3-raylet cluster (a module fixture), started once
pytestmark = [pytest.mark.xdist_group("serve_ray"), pytest.mark.cluster]

READY = re.compile(r"on http://127\.0\.0\.1:(\d+)/v1")
WORKER = re.compile(r"(w\d): node \S+, pid (\d+)")
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def cluster():
    """Three raylets of 1 CPU on this machine; their workers import tests/ (the fake runners)."""
    saved = {k: os.environ.get(k) for k in (*ENV, "PYTHONPATH")}
    os.environ.update(child_env(**ENV))  # the raylets start their workers with this environment
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c.address
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Server:
    """`serve --ray` in a process of its own: its SDK client, its workers' pids by name."""

    def __init__(self, tmp_path, data_dir, address: str, runner: str | None, workers: int = 3,
                 engine: tuple[str, ...] = ("--n-parallel", "4", "--max-tokens", "8"), model: str | None = None):
        """`runner`: the registered fake every worker runs; None: the real command on `model`."""
        args = ["serve", "--port", "0", "--data-dir", str(data_dir), "-m", model or fake_gguf(tmp_path), *engine,
                "--n-ctx", "1024", "--temperature", "0", "--prefix-store", "off",
                "--ray", address, "--ray-workers", str(workers), "--ray-cpus-per-worker", "1"]
        command = [fake_cli.PATH, runner] if runner else ["-m", "llamabatch"]
        self.proc = subprocess.Popen([sys.executable, *command, *args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=child_env(**ENV))
        self.said: list[str] = []
        killer = threading.Timer(300, self.proc.kill)  # a server that never says where it listens
        killer.start()
        try:
            for line in self.proc.stderr:
                self.said.append(line)
                found = READY.search(line)
                if found:
                    break
            else:
                raise AssertionError(f"serve ended before listening (exit {self.proc.wait()}): {''.join(self.said)}")
        finally:
            killer.cancel()
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # never let a full pipe stop it
        self.base = f"http://127.0.0.1:{found.group(1)}"
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=30)
        self.pids = {m.group(1): int(m.group(2)) for m in map(WORKER.search, self.said) if m}

    def health(self) -> dict:
        with urllib.request.urlopen(self.base + "/health", timeout=10) as answer:
            return json.loads(answer.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as answer:
            return answer.read().decode()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def run_batch(client, content: bytes):
    f = client.files.create(file=("in.jsonl", content), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")


def answered_once(client, batch, n: int) -> tuple[list[dict], list[dict]]:
    outputs, errors = records(client, batch.output_file_id), records(client, batch.error_file_id)
    ids = [r["custom_id"] for r in outputs + errors]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n))  # every line, none twice
    return outputs, errors


def test_a_batch_and_online_requests_spread_over_the_workers(cluster, tmp_path):
    server = Server(tmp_path, tmp_path / "data", cluster, "fake",
                    engine=("--n-parallel", "4", "--max-tokens", "8", "--online-slots", "1"))
    try:
        assert set(server.pids) == {"w1", "w2", "w3"}
        # --online-slots 1 reserves one slot on each worker's engine, beside its 4 for batches
        assert "(12 slots + 3 for online requests over the Ray workers" in server.said[-1]
        done = wait_batch(server.client, run_batch(server.client, batch_file(60)).id, ended)
        outputs, _ = answered_once(server.client, done, 60)
        answer = server.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        streamed = server.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "yo"}],
                                                         stream=True)
        pieces = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
        health, metrics = server.health(), server.metrics()
    finally:
        server.stop()
    assert server.proc.returncode == 143  # SIGTERM drains and exits as without Ray (Ray's own handler exits 15)
    assert done.status == "completed" and done.request_counts.completed == 60
    assert all(r["response"]["status_code"] == 200 for r in outputs)
    assert answer.choices[0].message.content and pieces
    assert health["status"] == "ok" and [w["name"] for w in health["workers"]] == ["w1", "w2", "w3"]
    assert all(w["state"] == "ready" and w["lines"] > 0 and w["slots"] == 5 for w in health["workers"])
    assert sum(w["lines"] for w in health["workers"]) == 62
    # the node's address is whatever Ray found for this machine (127.0.0.1, or its own IP once another
    # cluster of the session ran here)
    assert re.search(r'llamabatch:ray_worker_requests_total\{node="[^"]+",worker="w3"\} [1-9]', metrics)
    manifest = next((tmp_path / "data").rglob("*.manifest.json"))
    assert "3 engine(s)" in json.loads(manifest.read_text())["ray"]  # the batch's manifest names the workers


def test_online_chats_sharing_a_prefix_go_over_http_to_the_worker_that_ran_it(cluster, tmp_path):
    system = {"role": "system", "content": "You are a terse assistant who answers in one word. " * 3}
    first = [system, {"role": "user", "content": "question 0"}]
    second = [*first, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "question 1"}]
    server = Server(tmp_path, tmp_path / "data", cluster, "slow", workers=2,
                    engine=("--n-parallel", "2", "--max-tokens", "3"))

    def lines_by_worker() -> dict:
        return {w["name"]: w["lines"] for w in server.health()["workers"]}

    def served_by(messages) -> list[str]:
        before = lines_by_worker()
        server.client.chat.completions.create(model="m", messages=messages)
        after = lines_by_worker()
        return [name for name in after if after[name] > before[name]]

    try:
        assert served_by(first) == ["w1"]  # nothing known: the shorter queue (a tie: the first)
        busy = threading.Thread(target=lambda: server.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "an unrelated request"}], max_tokens=40))
        busy.start()  # 2 s at 50 ms a step, on w1 (a tie again)
        deadline = time.monotonic() + 30
        while server.health()["workers"][0]["inflight"] != 1:
            assert time.monotonic() < deadline, "the unrelated request never ran on w1"
            time.sleep(0.05)
        assert served_by(second) == ["w1"]  # its prefix ran there: w1 though w2 was idle
        busy.join(30)
    finally:
        server.stop()


def test_a_worker_killed_mid_batch_costs_only_its_lines_which_run_once_elsewhere(cluster, tmp_path):
    server = Server(tmp_path, tmp_path / "data", cluster, "slow")
    try:
        batch = run_batch(server.client, batch_file(40))
        wait_batch(server.client, batch.id, lambda b: b.request_counts.completed >= 4)
        os.kill(server.pids["w1"], signal.SIGKILL)
        done = wait_batch(server.client, batch.id, ended, timeout=90)
        answered_once(server.client, done, 40)
        w1 = server.health()["workers"][0]
    finally:
        server.stop()
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 40, 0)
    assert w1["name"] == "w1" and w1["restarts"] == 1


def test_the_server_killed_mid_batch_resumes_it_on_restart(cluster, tmp_path):
    data_dir = tmp_path / "data"
    server = Server(tmp_path, data_dir, cluster, "slow")
    try:
        batch = run_batch(server.client, batch_file(400))
        wait_batch(server.client, batch.id, lambda b: b.request_counts.completed >= 12)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        server = Server(tmp_path, data_dir, cluster, "fake")  # joins the cluster again; the rest at 5 ms a step
        done = wait_batch(server.client, batch.id, ended, timeout=90)
        answered_once(server.client, done, 400)
    finally:
        server.stop()
    assert (done.status, done.request_counts.completed) == ("completed", 400)


def test_a_poison_line_is_engine_crashed_and_the_others_answered(cluster, tmp_path):
    lines = batch_lines(12)
    lines[5]["body"]["messages"][0]["content"] = POISON
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    server = Server(tmp_path, tmp_path / "data", cluster, "aborts_on_poison", workers=2)
    try:
        done = wait_batch(server.client, run_batch(server.client, content).id, ended, timeout=120)
        _, errors = answered_once(server.client, done, 12)
    finally:
        server.stop()
    assert [(r["custom_id"], r["error"]["code"]) for r in errors] == [("q5", "engine_crashed")]
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 11, 1)


@pytest.mark.model
def test_two_workers_on_the_model_answer_a_batch_and_online_requests_alike(cluster, tmp_path, model_path):
    # One slot per engine and no prompt cache: every line runs alone, so greedy text is the
    # same on either worker (../shared/probes/README.md: batch-mates change the rows).
    alone = ("--n-parallel", "1", "--no-cache-prompt", "--max-tokens", "6")
    server = Server(tmp_path, tmp_path / "data", cluster, None, workers=2, engine=alone, model=model_path)
    same = [{**line, "body": {**line["body"], "messages": [{"role": "user", "content": "Name a colour."}]}}
            for line in batch_lines(6)]
    try:
        done = wait_batch(server.client, run_batch(server.client, "".join(json.dumps(line) + "\n" for line in same)
                                                   .encode()).id, ended, timeout=240)
        outputs, _ = answered_once(server.client, done, 6)
        online = server.client.chat.completions.create(model="m", messages=[{"role": "user", "content":
                                                                              "Name a colour."}])
        workers = server.health()["workers"]
    finally:
        server.stop()
    texts = {r["response"]["body"]["choices"][0]["message"]["content"] for r in outputs}
    assert done.request_counts.completed == 6 and texts == {online.choices[0].message.content}
    assert [w["name"] for w in workers] == ["w1", "w2"] and all(w["lines"] > 0 for w in workers)


def test_an_address_nothing_answers_at_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, fake_cli.PATH, "fake", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "data"), "-m", fake_gguf(tmp_path), "--ray", "127.0.0.1:1"],
                          capture_output=True, text=True, env=child_env(**ENV), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("llamabatch: error: cannot join the Ray cluster at 127.0.0.1:1: "
                                                    "nothing answers there (Connection refused)")
