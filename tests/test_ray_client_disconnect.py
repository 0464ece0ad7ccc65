"""A Ray client driver (ray://) whose connection to the cluster is cut mid-batch, through a TCP
forwarder in front of the head's Ray client server (cut_proxy.py): the lines wait and go on
when it is back, none failed. A cut shorter than Ray's reconnect grace period is Ray's own
reconnect (nothing is lost, the pool does not even notice); a longer one ends the session and
its workers, and the pool joins again with fresh workers and runs the lines that were in flight
from the start; so does a head killed (kill -9 of all its processes) and started again at the
same address. The driver is a process of its own (ray_client_driver.py); the head is
`ray start --head --block` with 2 CPUs, the fake runner on its workers, one for the module.
An outage meant to outlast the grace period lasts until the driver says its session is lost
(polled, not slept past), and a head started again is not waited for: the driver's own joins
retry until it takes clients.
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
# one xdist worker runs the module: its tests share one Ray head (a module fixture), started once
pytestmark = [pytest.mark.xdist_group("ray_client_disconnect"), pytest.mark.cluster]


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


class Head:
    """`ray start --head --block` with its Ray client server, in a session of its own: started,
    killed with everything it started (SIGKILL to its process group), started again on the same
    ports, stopped."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="lbrc")  # short: Ray's socket paths live under it
        self.gcs_port, self.client_port = _free_port(), _free_port()
        self.proc: subprocess.Popen | None = None
        self.taking_clients = False
        self.start()
        self.ready()

    def start(self) -> None:
        """Start it; `ready` waits until it takes a Ray client (a driver joining meanwhile retries)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(self.gcs_port),
             "--num-cpus", "2", "--include-dashboard", "false", "--temp-dir", self.tmp, "--ray-client-server-port",
             str(self.client_port), "--disable-usage-stats"], env=child_env(**ENV), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.taking_clients = False

    def ready(self) -> None:
        deadline = time.monotonic() + 300
        while not self.taking_clients and not _client_connects(self.client_port):  # a head still starting fails
            assert self.proc.poll() is None, f"ray start failed: {self.proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the Ray head did not take a Ray client in 300 s"
            time.sleep(0.5)
        self.taking_clients = True

    def kill(self) -> None:
        family = _family(self.proc.pid)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        _reap(family)

    def stop(self) -> None:
        family = _family(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)  # `ray start --block` stops everything it started
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _reap(family)


def _reap(family: set[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(is_gone(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in family:  # only processes the head started, by id
        if not is_gone(p):
            os.kill(p, signal.SIGKILL)


@pytest.fixture(scope="module")
def head():
    h = Head()
    try:
        yield h
    finally:
        h.stop()


class Driver:
    """What the test can wait for from the driver while its connection is out."""

    def __init__(self, err: Path):
        self.err = err

    def said(self, text: str, timeout: float = 120) -> None:
        """Wait until the driver has said `text` on stderr (its notes go there as they come)."""
        deadline = time.monotonic() + timeout
        while text not in self.err.read_text():
            assert time.monotonic() < deadline, f"the driver never said {text!r}: {self.err.read_text()[-3000:]}"
            time.sleep(0.1)


def batch_with_an_outage(tmp_path: Path, head: Head, grace_s: int, outage) -> tuple[int, int, dict]:
    """The driver's batch through a CutProxy, with `outage(proxy, driver)` once a few lines are
    answered: (lines answered when it began, when it was over, the driver's report)."""
    head.ready()
    proxy = CutProxy(head.client_port)
    err = tmp_path / "err"
    driver = subprocess.Popen(
        [sys.executable, os.path.join(TESTS, "ray_client_driver.py"), f"ray://127.0.0.1:{proxy.port}", str(LINES),
         fake_gguf(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(err, "w"),
        text=True, env=child_env(**ENV, RAY_CLIENT_RECONNECT_GRACE_PERIOD=str(grace_s)))
    try:
        said = driver.stdout.readline()
        assert said.startswith("answered"), err.read_text()[-3000:]
        before = int(said.split()[1])
        outage(proxy, Driver(err))
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


LOST = "the Ray cluster can't be reached"  # the driver's note once Ray gave its session up


def cut_for(seconds: float):
    def outage(proxy: CutProxy, _driver: Driver) -> None:
        proxy.cut()
        time.sleep(seconds)
        proxy.restore()
    return outage


def cut_until_lost(proxy: CutProxy, driver: Driver) -> None:
    proxy.cut()
    driver.said(LOST)  # past the grace period: the session is gone, whatever the machine's speed
    proxy.restore()


def test_a_cut_within_rays_grace_period_is_reconnected_under_the_pool(tmp_path, head):
    _, _, report = batch_with_an_outage(tmp_path, head, 30, cut_for(2))
    assert Counter(map(tuple, report["outcomes"])) == {("length", None): LINES}  # every line answered once
    assert "lost" not in report["summary"][-1] and report["notes"][-1].startswith("llamabatch run: w2")


def test_a_longer_cut_pauses_the_lines_and_fresh_workers_run_them_when_it_is_back(tmp_path, head):
    before, after, report = batch_with_an_outage(tmp_path, head, 3, cut_until_lost)
    assert Counter(map(tuple, report["outcomes"])) == {("length", None): LINES}  # none failed, none twice
    assert after - before <= 4  # nothing ran while it was cut (2 x 2 slots may have been answered just then)
    assert "the cluster lost 1 time(s)" in report["summary"][-1]
    said = [n for n in report["notes"] if "Ray cluster" in n]
    assert "can't be reached" in said[0] and "none failed" in said[0] and "joined the Ray cluster again" in said[-1]


def test_the_head_killed_and_started_again_pauses_the_lines_and_fresh_workers_run_them(tmp_path, head):
    def head_down_and_up(_proxy: CutProxy, driver: Driver) -> None:
        head.kill()  # GCS, raylet, the client server and the workers: kill -9, all of them
        driver.said(LOST)
        head.start()  # on the same ports: the address the driver joins again, trying until it takes clients

    _, _, report = batch_with_an_outage(tmp_path, head, 3, head_down_and_up)
    assert Counter(map(tuple, report["outcomes"])) == {("length", None): LINES}  # none failed, none twice
    assert "the cluster lost 1 time(s)" in report["summary"][-1]
