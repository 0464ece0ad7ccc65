"""SIGTERM (what service managers and `timeout` send) ends `run` and `chat` like a first
Ctrl-C, with exit 143. (serve-stdin's is tested in test_serve_stdin.py.)"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from test_run_cli import read_records, slow_lines, start_run, wait_for_lines, write_lines

pytestmark = pytest.mark.model
FAST = ["--n-parallel", "2", "--n-ctx", "512", "--temperature", "0", "--threads", "1"]


@pytest.fixture(autouse=True)
def _bundled_model(model_path, monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)


def start(*args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llamabatch", *args], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sigterm_stops_run_like_ctrl_c_and_exits_143(tmp_path):
    lines = slow_lines(12, max_tokens=8)
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = start_run(str(inp), "-o", str(out), *FAST, "--max-inflight", "2", "--order", "completion")
    try:
        wait_for_lines(out, 1, proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    assert "terminated: reading no further" in stderr and re.search(r"Resume with:\n  llamabatch run ", stderr)
    records = read_records(out)
    assert 1 <= len(records) < len(lines)
    assert all(r["usage"]["completion_tokens"] == 8 for r in records)  # in-flight lines finished, not cut


def test_sigterm_ends_chat_with_143_and_no_traceback():
    proc = start("chat", *FAST, "--max-tokens", "400", "--n-parallel", "1", stdin=subprocess.PIPE)
    try:
        proc.stdin.write("Write a long story about a dragon.\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not proc.stdout.read(1):  # the reply has started streaming
            assert proc.poll() is None and time.monotonic() < deadline
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "terminated" in stderr
