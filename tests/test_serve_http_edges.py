"""`llamabatch serve` at its edges (fake runner): a client that leaves (mid-answer, mid-upload),
a line just past the upload limit, 405's Allow, the body's nesting bound, a bad Range, a
streamed request the engine refuses, the catalogue's mode, and a quiet stop on SIGTERM."""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

import fake_cli
from child_tools import child_env, fake_gguf
from llamabatch import SamplingParams
from llamabatch.serve.http.api_errors import ApiError
from llamabatch.serve.http.batches.upload_check import MAX_LINE_BYTES, UploadCheck

from http_server import CHAT, COMPLETIONS, batch_file, multipart, raw, reply, serving
from lazy_modules import lazy

openai = lazy("openai")


def _until(condition, timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def _port(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1].split("/")[0])


def _send_head(sock: socket.socket, path: str, length: int, content_type: str) -> None:
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())


def test_a_request_whose_client_leaves_stops_generating_and_frees_its_slot(tmp_path):
    def long_for_long(prompt: str) -> str:
        return "x" * 1000 if "long" in prompt else reply(prompt)

    # one slot, 100 ms a token: the abandoned request alone would hold it for ~25 s (the slot's context)
    with serving(tmp_path / "data", n_parallel=1, step_delay=0.1, reply_with=long_for_long) as server:
        body = json.dumps({"model": "any", "max_tokens": 1000, "prompt": "long"})
        with socket.create_connection(("127.0.0.1", _port(server))) as sock:
            _send_head(sock, "/v1/completions", len(body), "application/json")
            sock.sendall(body.encode())
            _until(lambda: server.engine.stats().slots_generating == 1, what="the long request generating")
        started = time.monotonic()  # the client is gone
        answer = server.client().completions.create(model="any", prompt="question 4")
        waited = time.monotonic() - started
        _until(lambda: server.service.online.running == 0, what="no online request left running")
    assert answer.choices[0].text == "answer 4"
    assert waited < 8, f"the next request waited {waited:.1f} s behind one nobody reads"


def test_a_line_past_the_limit_is_refused_when_its_newline_comes_in_the_same_chunk():
    line = json.dumps({"custom_id": "big", "method": "POST", "url": CHAT,
                       "body": {"messages": [{"role": "user", "content": "x" * MAX_LINE_BYTES}]}}).encode()
    check = UploadCheck(SamplingParams())
    with pytest.raises(ApiError, match="line 1 is longer than 16 MiB") as caught:
        check.feed(line + b"\n")
    assert caught.value.code == "line_too_long"


def test_405_says_which_methods_the_path_takes(tmp_path):
    with serving(tmp_path / "data") as server:
        files = raw("PUT", f"{server.base_url}/files")
        chat = raw("GET", f"{server.base_url}/chat/completions")
        one_file = raw("POST", f"{server.base_url}/files/file-abc")
    assert (files.status, chat.status, one_file.status) == (405, 405, 405)
    assert files.headers["allow"] == "GET, HEAD, POST"  # two routes share the path
    assert chat.headers["allow"] == "POST"
    assert one_file.headers["allow"] == "DELETE, GET, HEAD"
    assert files.json()["error"]["message"] == "Method PUT is not allowed on /v1/files."


def _with_metadata_nesting(levels: int) -> dict:
    """A completions body whose ignored `metadata` field nests `levels` arrays: the body nests levels + 1."""
    deep: list = []
    for _ in range(levels - 1):
        deep = [deep]
    return {"model": "any", "prompt": "question 2", "metadata": deep}


def test_a_request_body_nests_100_levels_and_the_refusal_names_it(tmp_path):
    with serving(tmp_path / "data") as server:
        def ask(levels: int):
            return raw("POST", f"{server.base_url}/completions",
                       json.dumps(_with_metadata_nesting(levels)).encode(), {"content-type": "application/json"})

        deepest, deeper = ask(99), ask(100)  # an ignored field 99 deep: the body nests 100
    assert deepest.status == 200 and deepest.json()["choices"][0]["text"] == "answer 2"
    assert deeper.status == 400
    assert deeper.json()["error"]["message"] == "the request body nests arrays or objects deeper than 100 levels"


def test_a_range_that_cannot_be_served_gets_openais_error_body(tmp_path):
    with serving(tmp_path / "data") as server:
        content = batch_file(2)
        f = server.client().files.create(file=("in.jsonl", content), purpose="batch")
        url = f"{server.base_url}/files/{f.id}/content"
        part = raw("GET", url, headers={"range": "bytes=0-9"})
        past = raw("GET", url, headers={"range": f"bytes={len(content) + 10}-"})
        malformed = raw("GET", url, headers={"range": "lines=1-2"})
    assert part.status == 206 and part.body == content[:10]
    assert past.status == 416 and past.headers["content-range"] == f"bytes */{len(content)}"
    assert past.json()["error"]["code"] == "range_not_satisfiable"
    assert "past the end of the file" in past.json()["error"]["message"]
    assert malformed.status == 400 and malformed.headers["content-type"] == "application/json"
    assert malformed.json()["error"]["message"] == "the Range header cannot be served: Only support bytes range"


def test_a_streamed_request_the_engine_refuses_gets_the_status_it_gets_unstreamed(tmp_path):
    too_long = "question 1 " + "x" * 400  # past the fake's 256-token slots
    with serving(tmp_path / "data") as server:
        client = server.client()
        with pytest.raises(openai.APIStatusError) as whole:
            client.completions.create(model="any", prompt=too_long)
        with pytest.raises(openai.APIStatusError) as streamed:
            client.completions.create(model="any", prompt=too_long, stream=True)
        pieces = "".join(c.choices[0].text for c in client.completions.create(model="any", prompt="question 3",
                                                                                stream=True))
    assert whole.value.status_code == streamed.value.status_code == 400
    assert whole.value.body == streamed.value.body
    assert pieces == "answer 3"


def test_a_client_leaving_mid_upload_is_no_error_and_leaves_no_part(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    files = tmp_path / "data" / "files"
    uvicorn_errors = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not reach the root
    with serving(tmp_path / "data") as server:
        uvicorn_errors.addHandler(caplog.handler)
        try:
            body, form = multipart({"purpose": "batch"}, "in.jsonl", batch_file(200))
            with socket.create_connection(("127.0.0.1", _port(server))) as sock:
                _send_head(sock, "/v1/files", len(body), form["content-type"])
                sock.sendall(body[: len(body) // 2])
                _until(lambda: any(files.glob(".*.part")), what="the upload's part file")
            _until(lambda: not any(files.glob(".*.part")), what="the part file removed")
            time.sleep(0.5)  # whatever the server logs about it, it logs now
        finally:
            uvicorn_errors.removeHandler(caplog.handler)
        assert server.client().files.list().data == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []


def test_the_catalogue_is_readable_by_its_owner_only_in_a_data_dir_others_can_read(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    umask = os.umask(0o022)
    try:
        with serving(data) as server:
            server.client().files.create(file=("in.jsonl", batch_file(1)), purpose="batch")  # writes the WAL
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.iterdir() if p.name.startswith("catalogue")}
    finally:
        os.umask(umask)
    assert modes == {"catalogue.sqlite3": 0o600, "catalogue.sqlite3-wal": 0o600, "catalogue.sqlite3-shm": 0o600}


READY = re.compile(r"on http://127\.0\.0\.1:(\d+)/v1")


def _sigint_as(disposition):
    """A child's SIGINT as a terminal gives it (default) or as a shell without job control gives a
    background command (ignored: then uvicorn's raise of the signal after its shutdown does nothing)."""
    return lambda: signal.signal(signal.SIGINT, disposition)


@pytest.mark.parametrize("sig, code, sigint", [(signal.SIGTERM, 143, signal.SIG_DFL), (signal.SIGINT, 130, signal.SIG_DFL),
                                               (signal.SIGINT, 130, signal.SIG_IGN)], ids=["term", "int", "int-inherited-ignored"])
def test_a_stop_signal_ends_serve_quietly_with_its_exit_code(tmp_path, sig, code, sigint):
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "-m", fake_gguf(tmp_path),
            "--n-parallel", "2", "--n-ctx", "512", "--threads", "1", "--prefix-store", "off"]
    proc = subprocess.Popen([sys.executable, fake_cli.PATH, "fake", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=child_env(), preexec_fn=_sigint_as(sigint))
    killer = threading.Timer(60, proc.kill)
    killer.start()
    try:
        said = []
        for line in proc.stderr:
            said.append(line)
            if READY.search(line):
                break
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(proc.stderr.read()))
        reader.start()
        ready = READY.search(said[-1]) if said else None
        assert ready, f"serve ended before listening: {''.join(said)}"
        assert "(2 slots, one KV cache they share, data in" in said[-1]  # serve's own default layout
        port = ready.group(1)
        assert raw("GET", f"http://127.0.0.1:{port}/v1/models").status == 200
        proc.send_signal(sig)
        got = proc.wait(30)
        reader.join(10)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    after = "".join(rest)
    assert got == code, after
    assert "error" not in after and "Traceback" not in after, after
