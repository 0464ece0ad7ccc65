"""`run` and `serve-stdin` when the engine child hangs, is stopped, or crashes on everything.

Real processes (the CLI's main in a process of its own, tests/fake_cli.py, and its supervised
child) with the scripted fake runner in the child and a file that only starts like a GGUF, so
no model loads: fast-suite tests.
The "slow" runner takes 50 ms a step, so a 20-token line lasts about a second.
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

import fake_cli
from supervised_child_runner import POISON
from child_tools import child_env, fake_gguf, wait_for_engine_child, wait_gone
from test_run_cli import read_records, slow_lines, wait_for_lines, write_lines

FAST = ["--n-parallel", "2", "--n-ctx", "256", "--threads", "1", "--temperature", "0"]


def start(args: list[str], runner: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, fake_cli.PATH, runner, *args], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())


def finish(proc: subprocess.Popen, timeout: float, more: str | None = None) -> tuple[str, str]:
    """Wait for the end (`more`: last input, then EOF) and read the rest of stdout and stderr;
    a process still running after `timeout` is killed. (Not communicate(): it reads the raw
    pipe and would lose what readline() already buffered.)"""
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        if proc.stdin is not None and not proc.stdin.closed:
            if more:
                proc.stdin.write(more)
            proc.stdin.close()
        stdout = proc.stdout.read()
        stderr = proc.stderr.read()
        proc.wait()
        return stdout, stderr
    finally:
        killer.cancel()


def test_run_with_a_stopped_child_answers_every_line_once(tmp_path):
    lines = slow_lines(10, max_tokens=20)
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = start(["run", str(inp), "-o", str(out), "-m", fake_gguf(tmp_path), *FAST, "--watchdog", "2"], "slow")
    wait_for_lines(out, 1, proc)
    child = wait_for_engine_child(proc.pid)
    os.kill(child, signal.SIGSTOP)
    _, stderr = finish(proc, 120)
    assert proc.returncode == 0, stderr
    records = read_records(out)
    assert [r["id"] for r in records] == [line["id"] for line in lines]  # each once, in input order
    assert all(r["error"] is None and r["usage"]["completion_tokens"] == 20 for r in records)
    assert "restarted 1 time(s) (1 of them hung: killed by the watchdog)" in stderr
    assert re.search(r"^llamabatch: the engine process \d+ was killed by the watchdog: no progress for [\d.]+s with "
                     r"\d+ request\(s\) in flight \(bound [\d.]+s", stderr, re.M), stderr  # said when it happens
    assert wait_gone(child, 5)


def test_serve_stdin_with_a_stopped_child_answers_every_request_once(tmp_path):
    proc = start(["serve-stdin", "-m", fake_gguf(tmp_path), *FAST, "--watchdog", "2"], "slow", stdin=subprocess.PIPE)
    ids = [f"s{i}" for i in range(6)]
    for i in ids:
        proc.stdin.write(json.dumps({"id": i, "prompt": f"request {i}", "max_tokens": 20, "ignore_eos": True,
                                     "stream": True}) + "\n")
    proc.stdin.flush()
    events = []
    while not any(e["event"] == "done" for e in events):  # one finished: the others are mid-flight
        events.append(json.loads(proc.stdout.readline()))
    child = wait_for_engine_child(proc.pid)
    os.kill(child, signal.SIGSTOP)
    # then EOF: --on-eof drain waits for every request, the hung child's too
    stdout, stderr = finish(proc, 120, '{"op": "stats", "id": "st"}\n')
    assert proc.returncode == 0, stderr
    events += [json.loads(line) for line in stdout.splitlines()]
    ends = [e for e in events if e["event"] in ("done", "error") and e.get("id") in ids]
    assert sorted(e["id"] for e in ends) == ids  # exactly one terminal event each
    assert all(e["event"] == "done" and e["finish_reason"] == "length" for e in ends)
    for e in ends:  # a retried request streams no token twice
        assert "".join(t["text"] for t in events if t["event"] == "token" and t["id"] == e["id"]) == e["text"]
    assert wait_gone(child, 5)


def test_sigterm_twice_with_a_stopped_child_exits_143_within_the_drain_bound(tmp_path):
    lines = slow_lines(10, max_tokens=20)
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = start(["run", str(inp), "-o", str(out), "-m", fake_gguf(tmp_path), *FAST, "--watchdog", "0",
                  "--drain-timeout", "2", "--order", "completion"], "slow")
    wait_for_lines(out, 1, proc)
    child = wait_for_engine_child(proc.pid)
    os.kill(child, signal.SIGSTOP)  # no watchdog: only the drain bound can end this run
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = finish(proc, 60)
    took = time.monotonic() - signalled
    assert proc.returncode == 143, stderr
    assert took < 12, f"exited {took:.1f}s after SIGTERM (drain bound 2 s, 5 s after a second signal)"
    assert "still in flight after the drain time" in stderr
    assert re.search(r"Resume with:\n  llamabatch run .*--resume", stderr)
    records = read_records(out)
    assert 1 <= len(records) < len(lines) and len({r["id"] for r in records}) == len(records)
    assert all(r["usage"]["completion_tokens"] == 20 for r in records)  # what was written is whole
    assert wait_gone(child, 5)


def test_serve_stdin_sigterm_with_a_stopped_child_ends_every_request_within_the_bound(tmp_path):
    proc = start(["serve-stdin", "-m", fake_gguf(tmp_path), *FAST, "--watchdog", "0", "--drain-timeout", "2"], "slow",
                 stdin=subprocess.PIPE)
    ids = [f"s{i}" for i in range(4)]
    for i in ids:
        proc.stdin.write(json.dumps({"id": i, "prompt": f"request {i}", "max_tokens": 1000, "ignore_eos": True,
                                     "stream": True}) + "\n")
    proc.stdin.flush()
    while json.loads(proc.stdout.readline())["event"] != "token":
        pass
    child = wait_for_engine_child(proc.pid)
    os.kill(child, signal.SIGSTOP)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = finish(proc, 60)
    assert proc.returncode == 143, stderr
    assert time.monotonic() - signalled < 12
    ends = [json.loads(line) for line in stdout.splitlines()]
    ends = [e for e in ends if e["event"] in ("done", "error")]
    assert sorted(e["id"] for e in ends) == ids and all(e.get("finish_reason") == "cancelled" for e in ends)
    assert wait_gone(child, 5)


def test_run_whose_engine_crashes_on_everything_is_one_engine_error_not_the_lines(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", slow_lines(2, max_tokens=4))
    out = tmp_path / "out.jsonl"
    proc = start(["run", str(inp), "-o", str(out), "-m", fake_gguf(tmp_path), *FAST, "--threads", "7"],
                 "always_aborts")
    _, stderr = finish(proc, 120)
    assert proc.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("llamabatch: error:")]
    assert len(errors) == 1 and "crashes whatever it runs" in errors[0] and "threads=7" in errors[0], stderr
    assert "the input lines are not the cause" in errors[0]
    assert read_records(out) == []  # no line is blamed: --resume runs them all once the setting is fixed
    assert "--resume" in stderr


def test_sigterm_while_the_model_loads_leaves_no_child(tmp_path):
    """A child left behind: the parent exited on SIGTERM and the child, busy loading
    (not reading its stdin), went on growing. Now it dies with the parent."""
    inp = write_lines(tmp_path / "in.jsonl", slow_lines(2, max_tokens=4))
    proc = start(["run", str(inp), "-m", fake_gguf(tmp_path), *FAST], "slow_load")
    child = wait_for_engine_child(proc.pid)
    time.sleep(0.5)  # inside its load
    proc.send_signal(signal.SIGTERM)
    _, stderr = finish(proc, 30)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert wait_gone(child, 5), "the engine child outlived run"


def test_run_no_isolate_on_a_line_that_takes_the_process_down_ends_after_two_resumes_not_in_a_loop(tmp_path):
    """The engine in run's own process: the line kills run. Each --resume runs the lines that
    were in flight alone, and the one that took the process down alone a second time gets an
    engine_crashed record: the third run finishes, every line answered once."""
    lines = [{"id": f"q{i}", "prompt": POISON if i == 3 else f"Count from {i}:", "max_tokens": 6} for i in range(10)]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    args = ["run", str(inp), "-o", str(out), "-m", fake_gguf(tmp_path), *FAST, "--no-isolate", "--resume"]
    codes = []
    for _ in range(3):
        proc = start(args, "aborts_on_poison")
        _, stderr = finish(proc, 60)
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
    assert codes[-1] == 0 and len(codes) == 3 and all(c != 0 for c in codes[:-1]), (codes, stderr)
    records = read_records(out)
    assert sorted(r["id"] for r in records) == sorted(line["id"] for line in lines)  # each once
    assert [(r["id"], r["error"]["code"]) for r in records if r["error"]] == [("q3", "engine_crashed")]
    assert "earlier runs: 'q3'" in stderr and not os.path.exists(f"{out}.inflight.jsonl")
