"""`llamabatch serve`'s Files and Batches API through the official openai SDK, on a real uvicorn
server in this process over the scripted fake runner: upload -> create -> poll -> download,
cancel, lists and their pages, and the SDK's exception classes for 400, 401 and 404."""
from __future__ import annotations

import json
import time

import pytest

from http_server import CHAT, COMPLETIONS, EMBEDDINGS, batch_file, batch_lines, ended, raw, records, serving, wait_batch
from lazy_modules import lazy

openai = lazy("openai")


def test_upload_create_poll_download_with_a_bad_line_as_its_error_record(tmp_path):
    lines = batch_lines(12)
    lines[4]["body"]["temperature"] = "hot"  # that line's error record, not the file's refusal
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with serving(tmp_path / "data") as server:
        client = server.client()
        uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
        assert uploaded.filename == "requests.jsonl" and uploaded.bytes == len(data) and uploaded.purpose == "batch"
        assert client.files.retrieve(uploaded.id).id == uploaded.id
        assert client.files.content(uploaded.id).content == data
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                      metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
        done = wait_batch(client, batch.id, ended)
        assert done.status == "completed"
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (12, 11, 1)
        assert done.in_progress_at and done.finalizing_at and done.completed_at >= done.created_at
        outputs, errors = records(client, done.output_file_id), records(client, done.error_file_id)
    assert sorted(r["custom_id"] for r in outputs + errors) == sorted(f"q{i}" for i in range(12))
    for record in outputs:
        body = record["response"]["body"]
        assert record["response"]["status_code"] == 200 and record["error"] is None
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == f"answer {record['custom_id'][1:]}"
    [bad] = errors
    assert bad["custom_id"] == "q4" and bad["response"]["status_code"] == 400
    assert bad["error"]["code"] == "invalid_request" and "temperature" in bad["error"]["message"]


def test_completions_and_embeddings_batches(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        for url, kind in ((COMPLETIONS, "text_completion"), (EMBEDDINGS, "list")):
            f = client.files.create(file=("in.jsonl", batch_file(3, url)), purpose="batch")
            done = wait_batch(client, client.batches.create(input_file_id=f.id, endpoint=url,
                                                            completion_window="24h").id, ended)
            assert (done.status, done.request_counts.completed, done.error_file_id) == ("completed", 3, None)
            bodies = [r["response"]["body"] for r in records(client, done.output_file_id)]
            assert [b["object"] for b in bodies] == [kind] * 3
    assert {b["choices"][0]["text"] for b in bodies if kind == "text_completion"} <= {"answer 0", "answer 1", "answer 2"}


def test_cancel_writes_the_partial_output_and_counts_it(tmp_path):
    with serving(tmp_path / "data", step_delay=0.02) as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(60)), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        wait_batch(client, batch.id, lambda b: b.request_counts.completed >= 3)
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = wait_batch(client, batch.id, ended)
        assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
        outputs = records(client, done.output_file_id)
        assert 3 <= len(outputs) < 60 and done.request_counts.completed == len(outputs)
        assert len({r["custom_id"] for r in outputs}) == len(outputs)
        assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling again changes nothing


def test_a_queued_batch_cancelled_before_it_starts_never_runs(tmp_path):
    with serving(tmp_path / "data", step_delay=0.02, max_concurrent_batches=1) as server:  # the second waits
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(30)), purpose="batch")
        first = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        second = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        assert client.batches.cancel(second.id).status == "cancelled"
        client.batches.cancel(first.id)
        wait_batch(client, first.id, ended)
        gone = client.batches.retrieve(second.id)
        assert gone.status == "cancelled" and gone.in_progress_at is None and gone.output_file_id is None


def test_a_batch_past_its_completion_window_expires_with_what_it_did(tmp_path):
    late = [0.0]
    with serving(tmp_path / "data", step_delay=0.02, clock=lambda: time.time() + late[0],
                 max_concurrent_batches=1) as server:  # the second waits, and expires waiting
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(60)), purpose="batch")
        running = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        queued = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        assert running.expires_at == running.created_at + 24 * 3600
        wait_batch(client, running.id, lambda b: b.request_counts.completed >= 3)
        late[0] = 24 * 3600 + 1
        expired = wait_batch(client, running.id, ended)
        never_ran = wait_batch(client, queued.id, ended)
        outputs = records(client, expired.output_file_id)
    assert expired.status == "expired" and expired.expired_at and 3 <= len(outputs) < 60
    assert expired.request_counts.completed == len(outputs)
    assert never_ran.status == "expired" and never_ran.in_progress_at is None


def test_lists_page_newest_first_with_after_and_limit(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
        made = [client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
                for _ in range(5)]
        page = client.batches.list(limit=2)
        assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
        after = client.batches.list(limit=2, after=page.data[-1].id)
        assert [b.id for b in after.data] == made[::-1][2:4]
        assert [b.id for b in client.batches.list(limit=2)] == made[::-1]  # the SDK follows the pages
        for batch_id in made:
            wait_batch(client, batch_id, ended)
        files = client.files.list()
        assert f.id in [x.id for x in files] and all(x.object == "file" for x in files)
        outputs = client.files.list(purpose="batch_output")
        assert len(outputs.data) == 5 and all(x.purpose == "batch_output" for x in outputs.data)


def test_errors_are_the_sdks_exception_classes(tmp_path):
    with serving(tmp_path / "data", api_key="sesame") as server:
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="sesame-and-more").batches.list()
        client = server.client(api_key="sesame")
        assert [m.id for m in client.models.list()] == [server.engine.model_name]
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_" + "0" * 24)
        for nasty in ("file-../../catalogue.sqlite3", "file-" + "a" * 500, "file-\u00e9", "catalogue.sqlite3"):
            with pytest.raises(openai.NotFoundError):
                client.files.content(nasty)
        for path in ("/files/..%2Fcatalogue.sqlite3/content", "/files/%2e%2e/content", "/files/file-%00/content"):
            answer = raw("GET", server.base_url + path, headers={"authorization": "Bearer sesame"})
            assert answer.status == 404 and answer.json()["error"]["type"] == "invalid_request_error"
        with pytest.raises(openai.BadRequestError, match="purpose"):
            client.files.create(file=("in.jsonl", batch_file(1)), purpose="fine-tune")
        f = client.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            client.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="endpoint"):  # the file's lines ask for chat
            client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="completion_window"):
            client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="1h")
        with pytest.raises(openai.BadRequestError, match="metadata"):
            client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                                  metadata={f"k{i}": "v" for i in range(17)})
        with pytest.raises(openai.NotFoundError):
            client.batches.create(input_file_id="file-" + "1" * 24, endpoint=CHAT, completion_window="24h")


def test_deleting_files(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(2)), purpose="batch")
        done = wait_batch(client, client.batches.create(input_file_id=f.id, endpoint=CHAT,
                                                        completion_window="24h").id, ended)
        assert client.files.delete(done.output_file_id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.content(done.output_file_id)
        assert client.files.delete(f.id).deleted
        assert not list((tmp_path / "data" / "files").glob("*.jsonl"))
