"""`llamabatch serve-stdin` in-process: the whole command (options, config file, protocol,
loop) through `main()` with os.pipe streams, on the scripted fake runner. No model: each
test takes milliseconds. Real processes on the bundled model: test_serve_stdin.py.

The command must run on the main thread (it installs signal handlers), so each test's
conversation runs as a script on a second thread: it writes request lines, waits for
events and closes stdin, which ends the command.
"""
from __future__ import annotations

import io
import json
import os
import threading
import time
from typing import Any, Callable

from llamabatch.cli.app import main
from llamabatch.cli.env import Environment

from cli_harness import fake_factory, runner_for

TIMEOUT = 10


class Session:
    """The client side of one serve-stdin run: `send` lines, `wait_for` events."""

    def __init__(self, stdin_fd: int, stdout_fd: int):
        self._stdin = stdin_fd
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, args=(stdout_fd,), daemon=True).start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for raw in f:
                with self._cond:
                    self.events.append(json.loads(raw))  # every line must be one whole JSON object
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def send(self, *items: dict[str, Any] | str) -> None:
        os.write(self._stdin, "".join((json.dumps(i) if isinstance(i, dict) else i) + "\n" for i in items).encode())

    def close(self) -> None:
        os.close(self._stdin)

    def wait_for(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        with self._cond:
            while True:
                for event in self.events:
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                assert not self._closed and left > 0, f"no matching event; got {self.events}"
                self._cond.wait(left)

    def terminal(self, request_id: Any) -> dict[str, Any]:
        return self.wait_for(lambda e: e.get("id") == request_id and e["event"] in ("done", "error")
                             and "op" not in e and e.get("error", {}).get("code") != "duplicate_id")

    def of(self, request_id: Any, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("id") == request_id and e["event"] == kind]

    def wait_closed(self) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._closed, TIMEOUT)


def serve(args: list[str], script: Callable[[Session], None], *, root: tuple[str, ...] = (),
          **runner_kw: Any) -> tuple[int, Session, str]:
    """Run `llamabatch [ROOT] serve-stdin ARGS` with `script` as the client; returns the
    exit code, the session (every event) and stderr."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    session = Session(in_w, out_r)
    failure: list[BaseException] = []

    def client() -> None:
        try:
            session.wait_for(lambda e: e["event"] == "ready")
            script(session)
        except BaseException as exc:  # re-raised on the test's thread
            failure.append(exc)
        finally:
            try:
                session.close()
            except OSError:
                pass

    stderr = io.StringIO()
    stdin, stdout = os.fdopen(in_r, "r"), os.fdopen(out_w, "w")
    env = Environment(stdin, stdout, stderr, engine_factory=fake_factory(runner_for(**runner_kw), []))
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        code = main([*root, "serve-stdin", *args], env)
    finally:
        stdout.close()
        stdin.close()
    thread.join(TIMEOUT)
    session.wait_closed()
    if failure:
        raise failure[0]
    return code, session, stderr.getvalue()


def long_request(request_id: str, max_tokens: int = 400, **extra: Any) -> dict[str, Any]:
    return {"id": request_id, "prompt": "Tell me a long story.", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, **extra}


SLOW = {"step_delay": 0.003}  # ~3 ms a tick: a 400-token request lasts long enough to act on it


def test_ready_then_concurrent_streamed_requests_and_stats():
    ids = [f"r{i}" for i in range(4)]

    def script(s: Session) -> None:
        s.send(*[{"id": i, "prompt": f"prompt {i}", "max_tokens": 16, "ignore_eos": True, "stream": True}
                 for i in ids])
        for i in ids:
            done = s.terminal(i)
            assert done["event"] == "done" and done["finish_reason"] == "length"
            assert done["usage"]["completion_tokens"] == 16
            assert "".join(t["text"] for t in s.of(i, "token")) == done["text"]
        s.send({"op": "stats", "id": "st"})
        stats = s.wait_for(lambda e: e["event"] == "stats")
        assert stats["id"] == "st" and stats["n_parallel"] == 4 and stats["in_flight"] == 0
        assert stats["submitted"] == 4 and stats["finished"] == 4 and stats["generated_tokens"] == 64
        assert stats["max_decode_tokens_per_tick"] > 1 and stats["last_tick"]["tick"] == stats["ticks"]

    code, s, stderr = serve(["--n-parallel", "4"], script, **SLOW)
    assert code == 0 and stderr == ""
    ready = s.events[0]
    assert ready["event"] == "ready" and ready["model"] == "fake-model" and ready["n_parallel"] == 4
    first_done = next(n for n, e in enumerate(s.events) if e["event"] == "done")
    assert len({e["id"] for e in s.events[:first_done] if e["event"] == "token"}) > 1  # in flight together


def test_a_late_request_joins_the_running_batch_and_cancel_ends_one_request():
    def script(s: Session) -> None:
        s.send(long_request("long"))
        s.wait_for(lambda e: e.get("id") == "long" and e["event"] == "token")
        s.send({"id": "late", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert s.terminal("late")["finish_reason"] == "length"
        assert not s.of("long", "done")  # the late one finished while the long one still generated
        s.send({"op": "cancel", "id": "long"})
        done = s.terminal("long")
        assert done["finish_reason"] == "cancelled" and 1 <= done["usage"]["completion_tokens"] < 400
        assert "".join(t["text"] for t in s.of("long", "token")) == done["text"]
        s.send({"op": "cancel", "id": "long"})  # no longer in flight
        error = s.wait_for(lambda e: e["event"] == "error" and e.get("op") == "cancel")
        assert error["id"] == "long" and error["error"]["code"] == "unknown_id"

    code, _, _ = serve(["--n-parallel", "2"], script, **SLOW)
    assert code == 0


def test_bad_lines_get_error_events_and_never_stop_the_server():
    def script(s: Session) -> None:
        s.send(long_request("busy"))
        s.wait_for(lambda e: e.get("id") == "busy" and e["event"] == "token")
        s.send("this is not json",                                          # line 2
               {"op": "pause"},                                             # line 3
               {"id": "busy", "prompt": "again"},                           # line 4: duplicate in-flight id
               {"id": "p1", "prompt": "Hi", "temprature": 0.2},             # line 5: unknown sampling field
               {"id": "p2", "prompt": "Hi", "max_tokens": -3},              # line 6: invalid value
               {"id": "p3", "prompt": "lighthouse " * 60},                  # line 7: does not fit a slot
               {"prompt": "Hi", "top_k": "many"},                           # line 8: no id -> line-8
               {"id": "ok", "prompt": "Hi", "max_tokens": 3})               # line 9: fine
        assert s.terminal("ok")["event"] == "done"
        for request_id in ("p1", "p2", "p3", "line-8"):
            s.terminal(request_id)
        errors = {e["line"]: e for e in s.events if e["event"] == "error"}
        assert errors[2]["error"]["code"] == "invalid_json" and "id" not in errors[2]
        assert errors[3]["error"]["code"] == "unknown_op" and errors[3]["op"] == "pause"
        assert errors[4]["error"]["code"] == "duplicate_id" and errors[4]["id"] == "busy"
        assert errors[5]["error"] == {"code": "invalid_request", "message": "unknown sampling parameter 'temprature'"}
        assert errors[6]["error"]["code"] == "invalid_request" and "max_tokens" in errors[6]["error"]["message"]
        assert errors[7]["id"] == "p3" and errors[7]["error"]["code"] == "context_overflow"
        assert errors[8]["id"] == "line-8" and "top_k" in errors[8]["error"]["message"]
        assert not s.of("busy", "done")  # the duplicate was rejected; the running one goes on
        s.send({"op": "cancel", "id": "busy"})
        assert s.terminal("busy")["finish_reason"] == "cancelled"

    code, _, _ = serve(["--n-parallel", "2", "--n-ctx", "1024"], script, **SLOW)
    assert code == 0


def test_max_queue_rejects_a_request_beyond_it_at_once():
    def script(s: Session) -> None:
        s.send(long_request("running"))
        s.wait_for(lambda e: e.get("id") == "running" and e["event"] == "token")  # it has the only slot
        s.send({"id": "waits", "prompt": "Hi", "max_tokens": 2}, {"id": "rejected", "prompt": "Hi", "max_tokens": 2})
        error = s.terminal("rejected")
        assert error["event"] == "error" and error["error"]["code"] == "queue_full" and error["line"] == 3
        s.send({"op": "cancel", "id": "running"})
        assert s.terminal("waits")["event"] == "done"

    code, _, _ = serve(["--n-parallel", "1", "--max-queue", "1"], script, **SLOW)
    assert code == 0


def test_eof_drains_and_on_eof_cancel_cancels_from_the_flag_or_the_config_file(tmp_path):
    def two(s: Session) -> None:
        s.send(long_request("a", max_tokens=30), {"messages": [{"role": "user", "content": "Say hi."}]})

    code, s, _ = serve(["--n-parallel", "2"], two, **SLOW)  # stdin closes right after the requests
    assert code == 0
    assert s.terminal("a")["finish_reason"] == "length" and s.terminal("line-2")["event"] == "done"
    assert [e["event"] for e in s.events if e["event"] != "token"] == ["ready", "done", "done"]

    code, s, _ = serve(["--n-parallel", "2", "--on-eof", "cancel"], two, step_delay=0.05)
    assert code == 0 and s.terminal("a")["finish_reason"] == "cancelled"

    config = tmp_path / "llamabatch.toml"
    config.write_text('[serve-stdin]\non_eof = "cancel"\n')
    code, s, _ = serve(["--n-parallel", "2"], two, root=("--config", str(config)), step_delay=0.05)
    assert code == 0 and s.terminal("a")["finish_reason"] == "cancelled"


def test_the_command_gives_back_fd_1_when_it_ends():
    # serve-stdin points fd 1 at stderr while it serves, so stray writes cannot corrupt the
    # protocol stream; afterwards fd 1 must be the caller's stdout again (an embedding caller keeps it).
    from llamabatch.cli.serve_stdin.command import protocol_stdout

    before = os.fstat(1)
    with protocol_stdout(1) as events_fd:
        assert os.fstat(1).st_ino == os.fstat(2).st_ino  # stray writes land on stderr meanwhile
        assert os.fstat(events_fd).st_ino == before.st_ino  # events go where stdout went
    after = os.fstat(1)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_streams_without_file_descriptors_are_one_line_and_exit_1():
    stderr = io.StringIO()
    env = Environment(io.StringIO('{"prompt": "hi"}\n'), io.StringIO(), stderr,
                      engine_factory=fake_factory(runner_for(), []))
    assert main(["serve-stdin", "--n-parallel", "1"], env) == 1
    assert stderr.getvalue() == "llamabatch: error: serve-stdin needs stdin and stdout with file descriptors\n"
