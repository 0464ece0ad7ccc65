"""`llamabatch serve` on the bundled model, through the openai SDK: a batch and an online chat
request share the engine. Properties only (never the model's words)."""
from __future__ import annotations

import json

import pytest

from llamabatch import SamplingParams
from llamabatch.engines import open_engine
from llamabatch.config import EngineConfig
from llamabatch.serve.http.app import build_app
from llamabatch.serve.http.server import listen
from llamabatch.serve.http.service import Service

from http_server import COMPLETIONS, ended, records, wait_batch

pytestmark = pytest.mark.model


def test_a_batch_and_online_requests_on_the_bundled_model(tmp_path):
    engine = open_engine(EngineConfig(model=None, n_parallel=3, n_ctx=3 * 512),
                         SamplingParams(temperature=0, max_tokens=12))
    service = Service(engine, str(tmp_path / "data"), online_slots=1)
    listening = listen(build_app(service), "127.0.0.1", 0)
    service.start()
    thread = listening.run_in_thread()
    try:
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{listening.port}/v1", api_key="unused", max_retries=0)
        lines = [{"custom_id": f"c{i}", "method": "POST", "url": COMPLETIONS,
                  "body": {"model": "gemma", "prompt": f"The number {i} is", "max_tokens": 8}} for i in range(4)]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        f = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
        chat = client.completions.create(model="gemma", prompt="Once upon a time", max_tokens=6, stream=True)
        streamed = list(chat)
        done = wait_batch(client, batch.id, ended, timeout=300)
        outputs = records(client, done.output_file_id)
    finally:
        listening.stop()
        thread.join(10)
        service.close(10)
        engine.close()
    assert done.status == "completed" and done.request_counts.completed == 4
    assert sorted(r["custom_id"] for r in outputs) == ["c0", "c1", "c2", "c3"]
    for record in outputs:
        choice = record["response"]["body"]["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        assert 0 < record["response"]["body"]["usage"]["completion_tokens"] <= 8
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")
    assert sum(len(c.choices[0].text) for c in streamed) > 0
