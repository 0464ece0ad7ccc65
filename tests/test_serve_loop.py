"""The serve-stdin loop in-process, on the scripted FakeRunner and os.pipe: no model, fast.
The real command through real pipes is tested in test_serve_stdin.py."""
from __future__ import annotations

import json
import os
import threading

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.serve.stdin.loop import Output, _lines, serve

from fake_runner import FakeRunner


def make_engine(**runner_kw) -> Engine:
    runner = FakeRunner(n_slots=2, slot_ctx=64, n_batch=64, **runner_kw)
    return Engine(EngineConfig(n_parallel=2, n_batch=64, chunk_size=16), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=8))


def feed(data: bytes, chunk: int) -> int:
    """A pipe whose write end sends `data` in `chunk`-byte writes, then closes."""
    r, w = os.pipe()

    def write() -> None:
        for i in range(0, len(data), chunk):
            os.write(w, data[i:i + chunk])
        os.close(w)

    threading.Thread(target=write, daemon=True).start()
    return r


def read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 65536):
        parts.append(chunk)
    os.close(fd)
    return b"".join(parts)


def test_lines_split_on_newlines_across_reads_and_skip_overlong_ones():
    data = b'ab\ncdefghij\nxy\n\nlast'
    for chunk in (1, 3, 100):
        assert list(_lines(feed(data, chunk), limit=5)) == [b"ab", None, b"xy", b"", b"last"]
    assert list(_lines(feed(b"abcdefgh", 2), limit=5)) == [None]


def test_output_writes_whole_lines_from_many_threads():
    r, w = os.pipe()
    out = Output(w)
    texts = ["x" * n for n in range(1, 200)]

    def send(tag: str) -> None:
        for t in texts:
            out.send({"id": tag, "text": t})

    threads = [threading.Thread(target=send, args=(tag,)) for tag in "abcd"]
    reader = threading.Thread(target=lambda: result.append(read_all(r)))
    result: list[bytes] = []
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.close()
    os.close(w)
    reader.join()
    events = [json.loads(line) for line in result[0].splitlines()]
    assert len(events) == 4 * len(texts)
    for tag in "abcd":  # each sender's lines complete and in its order
        assert [e["text"] for e in events if e["id"] == tag] == texts


def run_serve(lines: list[str], on_eof: str = "drain", **runner_kw) -> tuple[int, list[dict]]:
    engine = make_engine(**runner_kw)
    stdin = feed("".join(line + "\n" for line in lines).encode(), 7)
    r, w = os.pipe()
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.append(read_all(r)))
    reader.start()
    try:
        code = serve(engine, stdin, w, on_eof)  # pytest runs tests on the main thread: signals can be set
    finally:
        engine.close()
        os.close(w)
        os.close(stdin)
    reader.join()
    return code, [json.loads(line) for line in output[0].splitlines()]


def test_serve_drains_at_eof_and_answers_every_line_once():
    code, events = run_serve([
        '{"id": "a", "prompt": "hello", "stream": true}',
        '{"prompt": "hi"}',
        '{"id": "long", "prompt": "' + "z" * 80 + '"}',  # over the fake's 64-token slot: fails inside submit
        'oops',
        '{"op": "stats"}',
    ])
    assert code == 0
    assert events[0]["event"] == "ready" and events[0]["model"] == "fake-model"
    by_id = {e["id"]: e for e in events if e["event"] in ("done", "error") and "id" in e}
    assert by_id["a"]["text"] == "hello!" and by_id["a"]["finish_reason"] == "stop"
    assert "".join(e["text"] for e in events if e["event"] == "token" and e["id"] == "a") == "hello!"
    assert by_id["line-2"]["text"] == "hi!"
    assert by_id["long"]["error"]["code"] == "context_overflow" and by_id["long"]["line"] == 3
    assert [e["line"] for e in events if e["event"] == "error" and "id" not in e] == [4]
    assert sum(e["event"] == "stats" for e in events) == 1
    assert not [e for e in events if e["event"] == "token" and e["id"] != "a"]  # only "a" streamed


def test_serve_on_eof_cancel():
    code, events = run_serve(['{"id": "a", "prompt": "hello", "max_tokens": 50}'], on_eof="cancel",
                             reply=lambda prompt: "y" * 40, step_delay=0.01)
    assert code == 0
    [done] = [e for e in events if e["event"] == "done"]
    assert done["finish_reason"] == "cancelled"


def test_a_slow_reader_of_stdout_stops_the_reading_of_requests():
    # Backpressure: nobody reads stdout at first. Once `limit` events wait, serve-stdin reads no
    # further line, so the client's own writes block (its pipe fills) instead of memory growing.
    engine = make_engine()
    n, limit = 20_000, 16
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    fed = threading.Event()
    blocked: list[bool] = []
    output: list[bytes] = []

    def feed_all() -> None:
        os.write(stdin_w, b'{"op": "stats"}\n' * n)  # 320 KB: several times what a pipe holds
        os.close(stdin_w)
        fed.set()

    def read_late() -> None:
        blocked.append(not fed.wait(2.0))  # without backpressure the whole input is read in a blink
        output.append(read_all(out_r))

    threading.Thread(target=feed_all, daemon=True).start()
    reader = threading.Thread(target=read_late)
    reader.start()
    try:
        code = serve(engine, stdin_r, out_w, "drain", max_pending=limit)  # signal handlers: main thread
    finally:
        engine.close()
        os.close(out_w)
        os.close(stdin_r)
    reader.join()
    assert code == 0 and blocked == [True]
    events = [json.loads(line) for line in output[0].splitlines()]
    assert len(events) == n + 1 and sum(e["event"] == "stats" for e in events) == n


class _Sent:
    """Stands in for Output: keeps what the server sends."""

    def __init__(self):
        self.events: list[dict] = []

    def send(self, event: dict) -> None:
        self.events.append(event)


class _HeldEngine:
    """An engine whose requests end only when the test says, so a cancel can be made to race
    with a request's own end deterministically."""

    default_params = SamplingParams(max_tokens=4)

    def __init__(self):
        self.ends: dict[str, object] = {}
        self.cancelled: list[str] = []

    def subscribe(self, fn):
        return lambda: None

    def submit(self, prompt, params, stream, callback):
        engine = self

        class Handle:
            def cancel(self):
                engine.cancelled.append(prompt)

        handle = Handle()
        self.ends[prompt] = lambda reason: callback(handle, _result(reason))
        return handle


def _result(reason: str):
    from llamabatch.results import Result, Timings, Usage

    return Result(0, "x", [1], reason, Usage(1, 0, 1), Timings())


def test_every_cancel_line_gets_exactly_one_reply():
    from llamabatch.serve.stdin.loop import Server

    engine, sent = _HeldEngine(), _Sent()
    server = Server(engine, sent, threading.Event())
    for number, line in enumerate([
            '{"id": "raced", "prompt": "p1"}',
            '{"op": "cancel", "id": "raced"}',  # 2: the request ends with "length" before the cancel lands
            '{"id": "twice", "prompt": "p2"}',
            '{"op": "cancel", "id": "twice"}',  # 4: ends it
            '{"op": "cancel", "id": "twice"}',  # 5: a repeat
            '{"op": "cancel", "id": "gone"}'], start=1):  # 6: never in flight
        server.handle_line(line.encode(), number)
    engine.ends["p1"]("length")
    engine.ends["p2"]("cancelled")
    replies = {e["line"]: e for e in sent.events if e.get("op") == "cancel"}
    assert sorted(replies) == [2, 5, 6]  # line 4 is answered by twice's own `done`, "cancelled"
    assert replies[2] == {"id": "raced", "event": "cancel_ignored", "op": "cancel", "reason": "already finished",
                          "line": 2}
    assert replies[5]["event"] == "cancel_ignored" and replies[5]["reason"] == "already cancelled"
    assert replies[6]["event"] == "error" and replies[6]["error"]["code"] == "unknown_id"
    dones = [e for e in sent.events if e["event"] == "done"]
    assert [(d["id"], d["finish_reason"]) for d in dones] == [("raced", "length"), ("twice", "cancelled")]
    # a request's own terminal event comes before the replies to cancels that missed it
    assert sent.events.index(dones[0]) < sent.events.index(replies[2])
    assert server.in_flight == 0
