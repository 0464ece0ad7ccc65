"""A Ray client driver (ray://) whose connection to the cluster is cut mid-batch, through a TCP
forwarder in front of the head's Ray client server (cut_proxy.py): the lines wait and go on
when it is back, none failed. A cut shorter than Ray's reconnect grace period is Ray's own
reconnect (nothing is lost, the pool does not even notice); a longer one ends the session and
its workers, and the pool joins again with fresh workers and runs the lines that were in flight
from the start. The driver is a process of its own (ray_client_driver.py); the head is
`ray start --head --block` with 2 CPUs, the fake runner on its workers.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from child_tools import TESTS, child_env, children_of, fake_gguf, is_gone
from cut_proxy import CutProxy

ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
LINES = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _family(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for child in children_of(todo.pop()):
            out.add(child)
            todo.append(child)
    return out


def _client_connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    probe = subprocess.run([sys.executable, "-c", f"import ray; ray.init('ray://127.0.0.1:{port}'); ray.shutdown()"],
                           env=child_env(**ENV), capture_output=True, timeout=120)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def client_port():
    """A Ray head with its Ray client server; the client server's port."""
    tmp = tempfile.mkdtemp(prefix="lbrc")  # short: Ray's socket paths live under it
    port = _free_port()
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(_free_port()),
         "--num-cpus", "2", "--include-dashboard", "false", "--temp-dir", tmp, "--ray-client-server-port", str(port),
         "--disable-usage-stats"], env=child_env(**ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _client_connects(port):  # the first sessions on a head still starting fail
            assert head.poll() is None, f"ray start failed: {head.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the Ray head did not take a Ray client in 300 s"
            time.sleep(1)
        yield port
    finally:
        family = _family(head.pid)
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops everything it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        deadline = time.monotonic() + 30
        while not all(is_gone(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in family:  # only processes this fixture started, by id
            if not is_gone(p):
                os.kill(p, signal.SIGKILL)


def batch_with_a_cut(tmp_path: Path, client_port: int, cut_s: float, grace_s: int) -> tuple[int, int, dict]:
    """The driver's batch with the connection cut for `cut_s` once a few lines are answered:
    (lines answered when it was cut, when it was back, the driver's report)."""
    proxy = CutProxy(client_port)
    driver = subprocess.Popen(
        [sys.executable, os.path.join(TESTS, "ray_client_driver.py"), f"ray://127.0.0.1:{proxy.port}", str(LINES),
         fake_gguf(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp_path / "err", "w"),
        text=True, env=child_env(**ENV, RAY_CLIENT_RECONNECT_GRACE_PERIOD=str(grace_s)))
    try:
        said = driver.stdout.readline()
        assert said.startswith("answered"), (tmp_path / "err").read_text()[-3000:]
        before = int(said.split()[1])
        proxy.cut()
        time.sleep(cut_s)
        proxy.restore()
        driver.stdin.write("back\n")
        driver.stdin.flush()
        after = int(driver.stdout.readline().split()[1])
        report = json.loads(driver.stdout.readline())
        assert driver.wait(timeout=60) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
        proxy.close()
    return before, after, report


def test_a_cut_within_rays_grace_period_is_reconnected_under_the_pool(tmp_path, client_port):
    before, after, report = batch_with_a_cut(tmp_path, client_port, cut_s=4, grace_s=30)
    assert Counter(map(tuple, report["outcomes"])) == {("length", None): LINES}  # every line answered once
    assert "lost" not in report["summary"][-1] and report["notes"][-1].startswith("llamabatch run: w2")


def test_a_longer_cut_pauses_the_lines_and_fresh_workers_run_them_when_it_is_back(tmp_path, client_port):
    before, after, report = batch_with_a_cut(tmp_path, client_port, cut_s=12, grace_s=3)
    assert Counter(map(tuple, report["outcomes"])) == {("length", None): LINES}  # none failed, none twice
    assert after - before <= 4  # nothing ran while it was cut (2 x 2 slots may have been answered just then)
    assert "the cluster lost 1 time(s)" in report["summary"][-1]
    said = [n for n in report["notes"] if "Ray cluster" in n]
    assert "can't be reached" in said[0] and "none failed" in said[0] and "joined the Ray cluster again" in said[-1]
