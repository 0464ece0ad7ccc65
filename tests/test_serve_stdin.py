"""`llamabatch serve-stdin` through real pipes, on the bundled model.

Each test starts the command as a subprocess, writes request lines while it runs and reads
the events as they come. Requests use temperature 0 and ignore_eos so their lengths are
known; max_tokens stays small so the file runs in about a minute on two cores.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.model  # every test here starts the real command on the bundled model

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60  # seconds for any one expected event: generous for a busy two-core machine
TERMINAL = ("done", "error")


def is_terminal(event: dict[str, Any], request_id: Any) -> bool:
    """A request's own end: not an error answering a control line ("op") or a rejected duplicate."""
    return (event.get("id") == request_id and event["event"] in TERMINAL and "op" not in event
            and event.get("error", {}).get("code") != "duplicate_id")


def command(*args: str, root: tuple[str, ...] = ()) -> list[str]:
    # One llama.cpp thread: the tests share two cores with other work, and two threads that
    # wait on each other at every step slow down far more under contention than one.
    return [sys.executable, "-m", "llamabatch", *root, "serve-stdin", "--threads", "1", *args]


class Serve:
    """A running `llamabatch serve-stdin` with a thread collecting its events."""

    def __init__(self, *args: str, root: tuple[str, ...] = ()):
        self.proc = subprocess.Popen(
            command(*args, root=root),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        self.events: list[dict[str, Any]] = []
        self.raw_lines: list[bytes] = []
        self.stderr = b""
        self._cond = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()
        self.ready = self.wait_for(lambda e: e["event"] == "ready")

    def _read(self) -> None:
        for raw in self.proc.stdout:
            with self._cond:
                self.raw_lines.append(raw)
                self.events.append(json.loads(raw))  # every stdout line must be one whole JSON object
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        self.stderr = self.proc.stderr.read()

    def send(self, *items: dict[str, Any] | str) -> None:
        """Write lines (dicts as JSON, strings as they are) in one write, then flush."""
        data = "".join((json.dumps(i) if isinstance(i, dict) else i) + "\n" for i in items)
        self.proc.stdin.write(data.encode())
        self.proc.stdin.flush()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise AssertionError(f"no matching event; got {self.events}\nstderr: {self.stderr.decode()}")
                self._cond.wait(left)

    def terminal(self, request_id: Any) -> dict[str, Any]:
        return self.wait_for(lambda e: is_terminal(e, request_id))

    def finish(self, timeout: float = TIMEOUT) -> int:
        """Close stdin (if still open), wait for exit and for every event."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float = TIMEOUT) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        self._err_reader.join(timeout)
        return code

    def of(self, request_id: Any, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("id") == request_id and e["event"] == kind]

    def assert_one_terminal_each(self, ids: list[Any]) -> None:
        for request_id in ids:
            ends = [e for e in self.events if is_terminal(e, request_id)]
            assert len(ends) == 1, (request_id, ends)


@pytest.fixture
def serve():
    started: list[Serve] = []

    def start(*args: str, root: tuple[str, ...] = ()) -> Serve:
        s = Serve(*args, root=root)
        started.append(s)
        return s

    yield start
    for s in started:  # a failed test must not leave a model loaded
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def long_request(request_id: str, max_tokens: int = 400, **extra: Any) -> dict[str, Any]:
    return {"id": request_id, "prompt": "Tell me a long story about a lighthouse.", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, **extra}


def assert_clean_stderr(s: Serve) -> None:
    text = s.stderr.decode()
    assert "Traceback" not in text and "Exception ignored" not in text, text


def test_ready_then_concurrent_streamed_requests_and_stats(serve):
    s = serve("--n-parallel", "4")
    assert s.ready["model"] and s.ready["n_parallel"] == 4
    assert s.ready["n_ctx"] == s.ready["slot_ctx"] * 4
    prompts = ["The capital of France is", "One, two, three,", "Roses are red,", "def fibonacci(n):"]
    ids = [f"r{i}" for i in range(4)]
    s.send(*[{"id": i, "prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
             for i, p in zip(ids, prompts)])
    for i in ids:
        done = s.terminal(i)
        assert done["event"] == "done" and done["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == 16
        assert "".join(t["text"] for t in s.of(i, "token")) == done["text"]
    # several requests were in flight at once: tokens of more than one request came before the first done
    first_done = next(n for n, e in enumerate(s.events) if e["event"] == "done")
    assert len({e["id"] for e in s.events[:first_done] if e["event"] == "token"}) > 1
    s.send({"op": "stats", "id": "st"})
    stats = s.wait_for(lambda e: e["event"] == "stats")
    assert stats["id"] == "st" and stats["n_parallel"] == 4
    assert stats["submitted"] == 4 and stats["finished"] == 4 and stats["in_flight"] == 0
    assert stats["generated_tokens"] == 64
    assert stats["max_decode_tokens_per_tick"] > 1  # one tick decoded tokens of several requests
    assert stats["last_tick"]["tick"] == stats["ticks"]
    assert s.finish() == 0
    s.assert_one_terminal_each(ids)
    assert_clean_stderr(s)


def test_a_request_arriving_mid_generation_joins_the_running_batch(serve):
    s = serve("--n-parallel", "2")
    s.send(long_request("long"))
    s.wait_for(lambda e: e.get("id") == "long" and e["event"] == "token")
    s.send({"id": "late", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    late = s.terminal("late")
    assert late["finish_reason"] == "length"
    assert not s.of("long", "done")  # the late one finished while the long one was still generating
    s.send({"op": "stats"})
    assert s.wait_for(lambda e: e["event"] == "stats")["max_decode_tokens_per_tick"] == 2
    s.send({"op": "cancel", "id": "long"})
    assert s.terminal("long")["finish_reason"] == "cancelled"
    assert s.finish() == 0


def test_cancel_ends_a_request_with_finish_reason_cancelled(serve):
    s = serve("--n-parallel", "2")
    s.send(long_request("a"), {"id": "b", "prompt": "Hi", "max_tokens": 6, "temperature": 0, "ignore_eos": True})
    s.wait_for(lambda e: e.get("id") == "a" and e["event"] == "token")
    s.send({"op": "cancel", "id": "a"})
    done = s.terminal("a")
    assert done["event"] == "done" and done["finish_reason"] == "cancelled"
    assert 1 <= done["usage"]["completion_tokens"] < 400
    assert "".join(t["text"] for t in s.of("a", "token")) == done["text"]
    assert s.terminal("b")["finish_reason"] == "length"  # the other request is untouched
    s.send({"op": "cancel", "id": "a"})  # no longer in flight
    error = s.wait_for(lambda e: e["event"] == "error" and e.get("op") == "cancel")
    assert error["id"] == "a" and error["error"]["code"] == "unknown_id"
    assert s.finish() == 0
    s.assert_one_terminal_each(["a", "b"])


def test_bad_lines_get_error_events_and_never_stop_the_server(serve):
    # slot_ctx = 1024 / 2 = 512 tokens: a 600-word prompt does not fit, 400 generated tokens do
    s = serve("--n-parallel", "2", "--n-ctx", "1024")
    s.send(long_request("busy"))
    s.wait_for(lambda e: e.get("id") == "busy" and e["event"] == "token")
    s.send(
        "this is not json",                                          # line 2
        {"op": "pause"},                                             # line 3
        {"id": "busy", "prompt": "again"},                           # line 4: duplicate in-flight id
        {"id": "p1", "prompt": "Hi", "temprature": 0.2},             # line 5: unknown sampling field
        {"id": "p2", "prompt": "Hi", "max_tokens": -3},              # line 6: invalid value
        {"id": "p3", "prompt": "lighthouse " * 600},                 # line 7: does not fit a slot
        {"prompt": "Hi", "top_k": "many"},                           # line 8: no id -> line-8
        {"id": "ok", "prompt": "Hi", "max_tokens": 3, "temperature": 0},  # line 9: fine
    )
    assert s.terminal("ok")["event"] == "done"
    errors = {e["line"]: e for e in s.events if e["event"] == "error"}
    assert errors[2]["error"]["code"] == "invalid_json" and "id" not in errors[2]
    assert errors[3]["error"]["code"] == "unknown_op" and errors[3]["op"] == "pause"
    assert errors[4]["error"]["code"] == "duplicate_id" and errors[4]["id"] == "busy"
    assert errors[5]["error"] == {"code": "invalid_request", "message": "unknown sampling parameter 'temprature'"}
    assert errors[5]["id"] == "p1"
    assert errors[6]["error"]["code"] == "invalid_request" and "max_tokens" in errors[6]["error"]["message"]
    assert errors[7]["id"] == "p3" and errors[7]["error"]["code"] == "context_overflow"
    assert errors[8]["id"] == "line-8" and "top_k" in errors[8]["error"]["message"]
    for e in errors.values():
        assert "\n" not in e["error"]["message"]
    # the duplicate was rejected; the request already running under that id goes on
    assert not s.of("busy", "done")
    s.send({"op": "cancel", "id": "busy"})
    assert s.terminal("busy")["finish_reason"] == "cancelled"
    assert s.finish() == 0
    s.assert_one_terminal_each(["busy", "p1", "p2", "p3", "line-8", "ok"])


def test_max_queue_rejects_a_request_beyond_it_at_once(serve):
    s = serve("--n-parallel", "1", "--max-queue", "1")
    s.send(long_request("running"))
    s.wait_for(lambda e: e.get("id") == "running" and e["event"] == "token")  # it has the only slot
    s.send({"id": "waits", "prompt": "Hi", "max_tokens": 2}, {"id": "rejected", "prompt": "Hi", "max_tokens": 2})
    error = s.terminal("rejected")
    assert error["event"] == "error" and error["error"]["code"] == "queue_full" and error["line"] == 3
    assert not s.of("running", "done")  # rejected while the queue was full, not after it moved
    s.send({"op": "cancel", "id": "running"})
    assert s.terminal("waits")["event"] == "done"  # the waiting one still runs
    assert s.finish() == 0
    s.assert_one_terminal_each(["running", "waits", "rejected"])


def test_eof_finishes_what_is_in_flight_then_exits_0(serve):
    s = serve("--n-parallel", "2", root=("--debug",))  # debug logs go to stderr, never into the events
    s.send({"id": "a", "prompt": "Count to five:", "max_tokens": 12, "temperature": 0, "ignore_eos": True},
           {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0})
    assert s.finish() == 0  # stdin closed right after the requests
    assert s.terminal("a")["finish_reason"] == "length"
    chat = s.terminal("line-2")
    assert chat["event"] == "done" and chat["finish_reason"] in ("stop", "length") and chat["text"]
    assert s.events[-1]["event"] == "done"
    assert len(s.events) == len(s.raw_lines) == 3  # ready, two done: stdout held nothing else
    assert b"llama" in s.stderr  # the model's load logs went to stderr
    assert_clean_stderr(s)


def test_on_eof_cancel_cancels_what_is_in_flight(serve):
    s = serve("--n-parallel", "2", "--on-eof", "cancel")
    s.send(long_request("a"), long_request("b"))
    s.wait_for(lambda e: e.get("id") == "b" and e["event"] == "token")
    assert s.finish() == 0
    for i in ("a", "b"):
        assert s.terminal(i)["finish_reason"] == "cancelled"
    s.assert_one_terminal_each(["a", "b"])
    assert_clean_stderr(s)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_cancels_in_flight_writes_their_events_and_exits(serve, sig, code):
    s = serve("--n-parallel", "2")
    s.send(long_request("a"), long_request("b"))
    s.wait_for(lambda e: e.get("id") == "b" and e["event"] == "token")
    s.proc.send_signal(sig)
    assert s.wait_exit() == code  # stdin is still open: the signal alone ends it
    for i in ("a", "b"):
        done = s.terminal(i)
        assert done["finish_reason"] == "cancelled"
        assert "".join(t["text"] for t in s.of(i, "token")) == done["text"]
    s.assert_one_terminal_each(["a", "b"])
    assert_clean_stderr(s)


@pytest.mark.parametrize("generating", [True, False], ids=["while-generating", "while-idle"])
def test_broken_pipe_on_stdout_stops_quietly(generating):
    proc = subprocess.Popen(command("--n-parallel", "2"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    try:
        assert json.loads(proc.stdout.readline())["event"] == "ready"
        if generating:
            proc.stdin.write((json.dumps(long_request("a", max_tokens=2000)) + "\n").encode())
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["event"] == "token"
        proc.stdout.close()  # the reader goes away; stdin stays open, so only that can end the process
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGPIPE
    assert err.decode() == ""  # quiet: no traceback, no "Exception ignored ... BrokenPipeError"


def test_example_client_runs():
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "serve_client.py"), "--threads", "1"],
                          capture_output=True, cwd=REPO, timeout=2 * TIMEOUT)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out.count("[done]") == 3 and "stats:" in out


def test_config_file_serve_stdin_table_sets_on_eof(tmp_path):
    config = tmp_path / "llamabatch.toml"
    config.write_text('[serve-stdin]\non_eof = "cancel"\n')
    proc = subprocess.run(command("--n-parallel", "1", root=("--config", str(config))),
                          input=(json.dumps(long_request("a")) + "\n").encode(), capture_output=True,
                          cwd=REPO, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr.decode()
    done = json.loads(proc.stdout.splitlines()[-1])
    assert done["id"] == "a" and done["finish_reason"] == "cancelled"
