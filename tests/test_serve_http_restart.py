"""`llamabatch serve` stopped in the middle of a batch (SIGKILL, SIGTERM), then started again on
the same data dir: the batch finishes, and every line has exactly one record across the output
and error files. Real processes (tests/fake_cli.py: the command line with the registered "slow"
fake runner, 50 ms a step, so a stop lands mid-batch; the restarted one runs the 5 ms "fake"),
driven with the openai SDK; and in-process servers left with batches in each unfinished status."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import fake_cli
from supervised_child_runner import POISON
from child_tools import child_env, fake_gguf
from llamabatch.serve.http.batches.batch_files import cut_torn_tail
from llamabatch.serve.http.catalogue import Catalogue

from http_server import CHAT, batch_file, ended, records, serving, wait_batch
from lazy_modules import lazy

openai = lazy("openai")

READY = re.compile(r"on http://127\.0\.0\.1:(\d+)/v1")


def start_server(tmp_path, data_dir, runner: str = "slow", *more: str) -> tuple[subprocess.Popen, openai.OpenAI]:
    args = ["serve", "--port", "0", "--data-dir", str(data_dir), "-m", fake_gguf(tmp_path), "--n-parallel", "4",
            "--n-ctx", "1024", "--threads", "1", "--temperature", "0", "--max-tokens", "8",
            "--prefix-store", "off", *more]
    proc = subprocess.Popen([sys.executable, fake_cli.PATH, runner, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    killer = threading.Timer(60, proc.kill)  # a server that never says where it listens
    killer.start()
    try:
        for line in proc.stderr:
            found = READY.search(line)
            if found:
                break
        else:
            raise AssertionError(f"the server ended before listening (exit {proc.wait()})")
    finally:
        killer.cancel()
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # never let a full pipe stop it
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{found.group(1)}/v1", api_key="unused", max_retries=0, timeout=30)
    return proc, client


def lines_file(n: int) -> bytes:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": CHAT,
              "body": {"model": "any", "messages": [{"role": "user", "content": f"question {i}"}]}} for i in range(n)]
    lines[5]["body"]["top_logprobs"] = 3  # without logprobs: this line's error record
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def test_kill_9_mid_batch_then_restart_finishes_every_line_exactly_once(tmp_path):
    data_dir = tmp_path / "data"
    proc, client = start_server(tmp_path, data_dir)
    try:
        f = client.files.create(file=("in.jsonl", lines_file(40)), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        wait_batch(client, batch.id, lambda b: b.request_counts.completed >= 6)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc, client = start_server(tmp_path, data_dir, "fake")  # the rest at the fake's own pace: 5 ms a step
        done = wait_batch(client, batch.id, ended, timeout=120)
        outputs, errors = records(client, done.output_file_id), records(client, done.error_file_id)
    finally:
        proc.kill()
        proc.wait(10)
    ids = [r["custom_id"] for r in outputs + errors]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40))  # every line, none twice
    assert [r["custom_id"] for r in errors] == ["r5"]
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 39, 1)


def test_sigterm_stops_the_server_and_a_restart_resumes_the_batch(tmp_path):
    data_dir = tmp_path / "data"
    proc, client = start_server(tmp_path, data_dir)
    try:
        f = client.files.create(file=("in.jsonl", lines_file(30)), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        wait_batch(client, batch.id, lambda b: b.request_counts.completed >= 4)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
        started = time.monotonic()
        proc, client = start_server(tmp_path, data_dir, "fake")
        assert client.batches.retrieve(batch.id).status == "in_progress"
        done = wait_batch(client, batch.id, ended, timeout=120)
        outputs, errors = records(client, done.output_file_id), records(client, done.error_file_id)
    finally:
        proc.kill()
        proc.wait(10)
    assert sorted(r["custom_id"] for r in outputs + errors) == sorted(f"r{i}" for i in range(30))
    assert time.monotonic() - started < 120


def test_a_stopped_server_resumes_in_progress_and_finishes_cancelling_and_finalizing_batches(tmp_path):
    data = tmp_path / "data"
    with serving(data, step_delay=0.02) as server:  # in this process: stopped by closing it
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(60)), purpose="batch")
        stopped = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
        wait_batch(client, stopped, lambda b: b.request_counts.completed >= 3)
    with serving(data, step_delay=0.02) as server:
        client = server.client()
        assert client.batches.retrieve(stopped).status in ("in_progress", "completed")
        done = wait_batch(client, stopped, ended)
        outputs = records(client, done.output_file_id)
        assert done.status == "completed" and sorted(r["custom_id"] for r in outputs) == sorted(
            f"q{i}" for i in range(60))
        small = client.files.create(file=("in.jsonl", batch_file(3)), purpose="batch")
        finished = wait_batch(client, client.batches.create(input_file_id=small.id, endpoint=CHAT,
                                                            completion_window="24h").id, ended)
        cancelled = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
        wait_batch(client, cancelled, lambda b: b.request_counts.completed >= 3)
    catalogue = Catalogue(str(data / "catalogue.sqlite3"))  # as a server killed at those moments leaves them
    catalogue.update_batch(finished.id, 0, status="finalizing", output_file_id=None)
    catalogue.update_batch(cancelled, int(time.time()), status="cancelling")
    catalogue.close()
    with serving(data) as server:
        client = server.client()
        again = wait_batch(client, finished.id, ended)
        stopped_late = wait_batch(client, cancelled, ended)
        assert again.status == "completed" and again.output_file_id is not None
        assert len(records(client, again.output_file_id)) == 3
        partial = records(client, stopped_late.output_file_id)
    assert stopped_late.status == "cancelled" and 3 <= len(partial) < 60
    assert len({r["custom_id"] for r in partial}) == len(partial) == stopped_late.request_counts.completed


def test_a_restart_with_other_settings_fails_the_batch_keeping_its_records_or_finishes_it_when_allowed(tmp_path):
    data = tmp_path / "data"
    with serving(data, step_delay=0.02) as server:  # max_tokens 16
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(40)), purpose="batch")
        refused = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
        wait_batch(client, refused, lambda b: b.request_counts.completed >= 3)
    with serving(data, max_tokens=8) as server:
        client = server.client()
        failed = wait_batch(client, refused, ended)
        kept = records(client, failed.output_file_id)
        allowed = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
        wait_batch(client, allowed, lambda b: b.request_counts.completed >= 3)
    assert failed.status == "failed" and len(kept) == failed.request_counts.completed >= 3
    error = failed.errors.data[0]
    assert error.code == "settings_changed" and "max_tokens: 16 → 8" in error.message, error
    assert "--allow-changed-settings" in error.message and str(tmp_path) not in error.message, error.message
    with serving(data, max_tokens=8, job_settings={"allow_changed_settings": True}) as server:
        client = server.client()
        done = wait_batch(client, allowed, ended)
        outputs = records(client, done.output_file_id)
    assert done.status == "completed" and sorted(r["custom_id"] for r in outputs) == sorted(f"q{i}" for i in range(40))


def test_a_torn_last_record_is_cut_back_to_whole_records(tmp_path):
    path = tmp_path / "output.jsonl"
    for content, whole in ((b'{"a": 1}\n{"b": 2}\n{"c":', b'{"a": 1}\n{"b": 2}\n'), (b'{"a": 1}\n', b'{"a": 1}\n'),
                           (b'{"torn', b""), (b"x" * (3 << 20) + b"\n" + b"y" * (3 << 20), b"x" * (3 << 20) + b"\n")):
        path.write_bytes(content)
        cut_torn_tail(str(path))
        assert path.read_bytes() == whole
    cut_torn_tail(str(tmp_path / "missing.jsonl"))  # nothing written yet: nothing to cut


def test_a_request_that_takes_the_engine_down_costs_serve_a_restart_of_its_child_not_the_server(tmp_path):
    proc, client = start_server(tmp_path, tmp_path / "data", "aborts_on_poison")  # the default flags
    try:
        try:
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": POISON}])
        except openai.APIStatusError as exc:
            assert exc.status_code >= 500 and "engine_crashed" in str(exc.body), exc.body
        else:
            raise AssertionError("a request that took the engine down was answered")
        answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "question 1"}])
        assert answer.choices[0].message.content and proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)


def test_a_batch_line_that_takes_the_server_down_is_answered_with_an_error_after_restarts_never_in_a_loop(tmp_path):
    """--no-isolate: the engine is in the server's process, so the line kills the server. Each
    restart resumes the batch; the lines in flight at a crash run alone, and one that took the
    process down alone twice gets an engine_crashed record: the third start finishes the batch."""
    data_dir = tmp_path / "data"
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": CHAT,
              "body": {"model": "any", "messages": [{"role": "user", "content": POISON if i == 2 else f"question {i}"}]}}
             for i in range(12)]
    proc, client = start_server(tmp_path, data_dir, "aborts_on_poison", "--no-isolate")
    batch_id, starts, done = None, 1, None
    try:
        f = client.files.create(file=("in.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                                purpose="batch")
        batch_id = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
        while done is None:
            try:
                done = wait_batch(client, batch_id, ended, timeout=60)
            except openai.APIConnectionError:  # the line took the server down: start it again
                assert proc.wait(10) != 0
                assert starts < 3, f"the server died {starts} times on one batch"
                proc, client = start_server(tmp_path, data_dir, "aborts_on_poison", "--no-isolate")
                starts += 1
        outputs, errors = records(client, done.output_file_id), records(client, done.error_file_id)
    finally:
        proc.kill()
        proc.wait(10)
    assert sorted(r["custom_id"] for r in outputs + errors) == sorted(f"r{i}" for i in range(12))  # each once
    assert [(r["custom_id"], r["error"]["code"]) for r in errors] == [("r2", "engine_crashed")]
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 11, 1)
