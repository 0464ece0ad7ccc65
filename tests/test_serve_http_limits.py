"""`llamabatch serve`'s limits and security: upload size and line count, files that are not
batch input files, request body size, the API key, the loopback rule and CORS."""
from __future__ import annotations

import json
import socket

import pytest

from llamabatch.errors import InvalidRequest
from llamabatch.serve.http import app as app_module
from llamabatch.serve.http.limits import UploadLimits
from llamabatch.serve.http.server import check_bind

from child_tools import fake_gguf
from cli_harness import invoke, runner_for
from http_server import CHAT, batch_file, ended, multipart, raw, records, serving, wait_batch
from lazy_modules import lazy

openai = lazy("openai")


def test_the_limits_are_openais():
    assert (UploadLimits().max_bytes, UploadLimits().max_lines) == (200_000_000, 50_000)


def test_uploads_past_the_line_and_size_limits_are_refused_and_leave_nothing(tmp_path):
    most = 2 * len(batch_file(10))
    with serving(tmp_path / "data", upload_limits=UploadLimits(max_bytes=most, max_lines=10)) as server:
        client = server.client()
        assert client.files.create(file=("ok.jsonl", batch_file(9) + b"\n" * 5 + batch_file(1, start=9)),
                                   purpose="batch").id  # blank lines are no requests
        with pytest.raises(openai.BadRequestError, match="more than 10 requests"):
            client.files.create(file=("big.jsonl", batch_file(11)), purpose="batch")
        one_long_line = json.dumps({"custom_id": "x", "method": "POST", "url": CHAT,
                                    "body": {"messages": [{"role": "user", "content": "x" * most}]}}).encode()
        with pytest.raises(openai.APIStatusError, match="larger than") as caught:
            client.files.create(file=("big.jsonl", one_long_line), purpose="batch")
        assert caught.value.status_code == 413
        assert len(client.files.list().data) == 1
    left = sorted(p.name for p in (tmp_path / "data" / "files").iterdir())
    assert len(left) == 1 and left[0].endswith(".jsonl")  # the refused uploads left no part behind


def test_a_file_that_is_not_batch_requests_is_refused_naming_the_line(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        good = batch_file(2)
        for bad, words in ((good + b"not json at all\n", "line 3"),
                           (good + b'{"prompt": "a plain line"}\n', "line 3 is not an OpenAI Batch request"),
                           (b"", "no request lines"),
                           (b"\xff\xfe{}\n", "line 1")):
            with pytest.raises(openai.BadRequestError, match=words):
                client.files.create(file=("in.jsonl", bad), purpose="batch")
        assert client.files.list().data == []


def test_request_bodies_past_the_limit_are_413(tmp_path, monkeypatch):
    monkeypatch.setattr(app_module, "MAX_BODY_BYTES", 1000)
    with serving(tmp_path / "data") as server:
        with pytest.raises(openai.APIStatusError) as caught:
            server.client().chat.completions.create(model="any", messages=[{"role": "user", "content": "x" * 2000}])
    assert caught.value.status_code == 413 and "larger than" in caught.value.message


def test_the_key_is_checked_before_anything_is_read(tmp_path):
    with serving(tmp_path / "data", api_key="sesame") as server:
        url = f"{server.base_url}/files"
        body, form = multipart({"purpose": "batch"}, "x.jsonl", batch_file(1))
        for headers in ({}, {"authorization": "sesame"}, {"authorization": "Basic sesame"},
                        {"authorization": "Bearer sesam"}, {"authorization": "Bearer sesamesesame"}):
            answer = raw("POST", url, body, {**form, **headers})
            assert answer.status == 401 and answer.json()["error"]["code"] == "invalid_api_key"
        assert raw("GET", url, headers={"authorization": "Bearer sesame"}).status == 200
        assert raw("POST", url, body, {**form, "authorization": "Bearer sesame"}).status == 200
    assert len(list((tmp_path / "data" / "files").glob("*.jsonl"))) == 1  # only the upload with the key


def test_no_cors_headers(tmp_path):
    with serving(tmp_path / "data") as server:
        origin = {"origin": "https://example.com", "access-control-request-method": "POST"}
        preflight = raw("OPTIONS", f"{server.base_url}/chat/completions", headers=origin)
        plain = raw("GET", f"{server.base_url}/models", headers={"origin": "https://example.com"})
    assert preflight.status == 405 and plain.status == 200
    assert not any(h.startswith("access-control-") for h in [*preflight.headers, *plain.headers])


def test_a_non_loopback_host_needs_a_key():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.10", "myhost.example"):
        with pytest.raises(InvalidRequest, match="without an API key"):
            check_bind(host, None)
        check_bind(host, "key")


def test_the_command_refuses_a_non_loopback_host_without_a_key_in_one_line(tmp_path):
    result = invoke(["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)], env={"LLAMABATCH_API_KEY": ""})
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "refusing to listen on 0.0.0.0 without an API key" in result.stderr


def _serve_on(tmp_path, *address: str):
    return invoke(["serve", *address, "--data-dir", str(tmp_path / "data"), "-m", fake_gguf(tmp_path),
                   "--n-parallel", "2", "--n-ctx", "512", "--no-isolate"], runner=runner_for(),
                  env={"LLAMABATCH_API_KEY": "key"})


def test_a_port_in_use_is_one_line_naming_it_before_any_engine_opens(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = _serve_on(tmp_path, "--port", str(port))
    assert result.exit_code == 2, result.stderr
    assert result.stderr == (f"llamabatch: error: cannot listen on 127.0.0.1:{port}: port {port} is already in use; "
                             "choose another --port (0: a free one)\n")
    assert result.engines == []  # refused before the model would load


@pytest.mark.parametrize("host, says", [("192.0.2.1", "--host 192.0.2.1 is not an address of this machine"),
                                        ("no-such-host.invalid", "--host no-such-host.invalid is not an address "
                                                                 "this machine knows")])
def test_a_host_that_cannot_be_listened_on_is_one_line_naming_it(tmp_path, host, says):
    result = _serve_on(tmp_path, "--host", host, "--port", "0")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and f"cannot listen on {host}:0: {says}" in result.stderr, result.stderr
    assert result.engines == []


def test_serve_failing_before_its_batches_start_says_one_line(tmp_path, monkeypatch):
    """The batch queue is closed without having started (no 'cannot join thread' on top)."""
    from llamabatch.serve.http import server

    def no_listening(*_args, **_kw):
        raise InvalidRequest("no listening today")

    monkeypatch.setattr(server, "listen", no_listening)
    result = _serve_on(tmp_path, "--port", "0")
    loading, error = result.stderr.splitlines()  # where the port answers while the model loads, then the error
    assert result.exit_code == 2 and loading.startswith("llamabatch serve: loading the model; http://127.0.0.1:")
    assert error == "llamabatch: error: no listening today"
    assert len(result.engines) == 1  # it got past the engine: the queue was built, never started


def test_batch_line_records_keep_their_custom_ids_for_malformed_json(tmp_path):
    torn = b'{"custom_id": "torn", "method": "POST", "url": "/v1/chat/completions", "body": {\n'
    with serving(tmp_path / "data") as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(2) + torn), purpose="batch")
        done = wait_batch(client, client.batches.create(input_file_id=f.id, endpoint=CHAT,
                                                        completion_window="24h").id, ended)
        [error] = records(client, done.error_file_id)
    assert error["custom_id"] == "torn" and error["error"]["code"] == "invalid_json"
    assert json.loads(json.dumps(error))["response"]["status_code"] == 400
