"""`llamabatch serve`'s service on a real uvicorn server in this process, over the scripted fake
runner, for tests that talk to it with the official `openai` SDK (tests/test_serve_http*.py).

    with serving(tmp_path) as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", batch_file(5)), purpose="batch")

The fake answers a prompt holding "question N" with "answer N" (see `reply`), so a test can
tell which line an answer belongs to.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import Any, Callable, Iterator

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.serve.http.app import build_app
from llamabatch.serve.http.limits import UploadLimits
from llamabatch.serve.http.server import listen
from llamabatch.serve.http.service import Service

from fake_runner import FakeRunner

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def reply(prompt: str) -> str:
    found = re.findall(r"question (\d+)", prompt)
    return f"answer {found[-1]}" if found else "answer"


@dataclass
class Running:
    base_url: str
    service: Service
    engine: Engine
    runner: FakeRunner | None  # None: an engine on the model (serving_engine)

    def client(self, api_key: str = "unused", timeout: float = 60, **kw: Any) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=timeout, **kw)


@contextlib.contextmanager
def serving(data_dir: Any, *, n_parallel: int = 4, step_delay: float = 0.0, api_key: str | None = None,
            online_slots: int = 1, reply_with: Callable[[str], str] = reply, max_tokens: int = 16,
            upload_limits: UploadLimits = UploadLimits(), clock: Callable[[], float] = time.time,
            job_settings: dict[str, Any] | None = None, reserved_slots: int = 0,
            max_concurrent_batches: int | None = None, slot_ctx: int = 256, chat_template: str | None = None,
            **app_options: Any) -> Iterator[Running]:
    """`app_options`: build_app's own (health_without_key, cors_origins); `chat_template` the engine's."""
    runner = FakeRunner(n_slots=n_parallel, slot_ctx=slot_ctx, n_batch=256, reply=reply_with, step_delay=step_delay)
    engine = Engine(EngineConfig(n_parallel=n_parallel, n_batch=256, chunk_size=64, n_ctx=slot_ctx * n_parallel,
                                 reserved_slots=reserved_slots, chat_template=chat_template),
                    runner=runner, default_params=SamplingParams(temperature=0, max_tokens=max_tokens))
    with serving_engine(engine, data_dir, runner=runner, api_key=api_key, online_slots=online_slots,
                        upload_limits=upload_limits, clock=clock, job_settings=job_settings,
                        max_concurrent_batches=max_concurrent_batches, **app_options) as running:
        yield running


@contextlib.contextmanager
def serving_engine(engine: Any, data_dir: Any, *, runner: FakeRunner | None = None, api_key: str | None = None,
                   online_slots: int = 1, upload_limits: UploadLimits = UploadLimits(),
                   clock: Callable[[], float] = time.time, job_settings: dict[str, Any] | None = None,
                   max_concurrent_batches: int | None = None, **app_options: Any) -> Iterator[Running]:
    """`serve`'s app over `engine` (fake or on the model) on a free loopback port, from a thread
    of this process; the service, then the engine, closed after."""
    service = Service(engine, str(data_dir), online_slots=online_slots, upload_limits=upload_limits, clock=clock,
                      job_settings=job_settings, max_concurrent_batches=max_concurrent_batches)
    try:
        listening = listen(build_app(service, api_key, **app_options), "127.0.0.1", 0)
        service.start()
        thread = listening.run_in_thread()
        try:
            yield Running(f"http://127.0.0.1:{listening.port}/v1", service, engine, runner)
        finally:
            listening.stop()
            thread.join(10)
    finally:
        service.close(10)
        engine.close()


def batch_lines(n: int, url: str = CHAT, start: int = 0, prefix: str = "q") -> list[dict[str, Any]]:
    """n OpenAI Batch request lines asking about "question i" (custom_id prefix + i)."""
    lines = []
    for i in range(start, start + n):
        if url == CHAT:
            body: dict[str, Any] = {"model": "any", "messages": [{"role": "user", "content": f"question {i}"}]}
        elif url == COMPLETIONS:
            body = {"model": "any", "prompt": f"question {i}"}
        else:
            body = {"model": "any", "input": f"question {i}"}
        lines.append({"custom_id": f"{prefix}{i}", "method": "POST", "url": url, "body": body})
    return lines


def batch_file(n: int, url: str = CHAT, **kw: Any) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in batch_lines(n, url, **kw)).encode()


def wait_batch(client: Any, batch_id: str, until: Callable[[Any], bool], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {batch.status} {batch.request_counts} after {timeout}s")
        time.sleep(0.05)


def ended(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "expired", "cancelled")


def records(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def raw(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    """One HTTP request as sent, without an SDK (what a client the SDK would never be might send)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body, headers=headers or {})
        got = conn.getresponse()
        return Answer(got.status, {k.lower(): v for k, v in got.getheaders()}, got.read())
    finally:
        conn.close()


def multipart(fields: dict[str, str], filename: str, content: bytes) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body with `fields` and one file part named "file"."""
    boundary = "llamabatch-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 "Content-Type: application/jsonl\r\n\r\n".encode() + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), {"content-type": f"multipart/form-data; boundary={boundary}"}
