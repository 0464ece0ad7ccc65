"""The online endpoints of `llamabatch serve` through the openai SDK (fake runner): chat and
completions, streamed and not, embeddings, and online requests answered while batches run."""
from __future__ import annotations

import array
import base64
import threading

import pytest

from http_server import CHAT, batch_file, ended, raw, records, serving, wait_batch
from lazy_modules import lazy

openai = lazy("openai")


def test_chat_completion_in_openais_shape(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "question 7"}])
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "answer 7" and answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == len("answer 7") and answer.usage.prompt_tokens > 0


def test_streamed_chat_joins_to_the_whole_answer(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        stream = client.chat.completions.create(model="any", stream=True, stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "question 12"}])
        chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == "answer 12" and len([p for p in pieces if p]) > 1  # token by token
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == len("answer 12") and not chunks[-1].choices
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_completions_streamed_and_not(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        whole = client.completions.create(model="any", prompt="question 3")
        streamed = "".join(c.choices[0].text for c in client.completions.create(model="any", prompt="question 3",
                                                                                  stream=True))
    assert whole.object == "text_completion" and whole.choices[0].text == "answer 3" == streamed


def test_embeddings(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        got = client.embeddings.create(model="any", input=["one", "two"])
        packed = client.embeddings.create(model="any", input="one", encoding_format="base64")
    assert [d.index for d in got.data] == [0, 1] and len(got.data[0].embedding) == 8
    assert got.data[0].embedding != got.data[1].embedding and got.usage.prompt_tokens == 6
    floats = array.array("f", base64.b64decode(packed.data[0].embedding))  # little-endian float32, as OpenAI's
    assert floats.tolist() == pytest.approx(got.data[0].embedding, rel=1e-6)


def test_bad_online_requests_are_400s_with_openais_error_body(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        with pytest.raises(openai.BadRequestError, match="temperature") as caught:
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}], temperature=-3)
        assert caught.value.body["type"] == "invalid_request_error"
        with pytest.raises(openai.BadRequestError, match="messages"):
            client.chat.completions.create(model="any", messages="not a list")
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="any", input=[])
        deep = "[" * 300 + "]" * 300
        answer = raw("POST", f"{server.base_url}/chat/completions", f'{{"messages": {deep}}}'.encode(),
                     {"content-type": "application/json"})
        assert answer.status == 400 and "deeper" in answer.json()["error"]["message"]
        assert raw("GET", f"{server.base_url}/nowhere").json()["error"]["message"].startswith("Unknown request URL")


def test_online_requests_are_answered_while_two_batches_run(tmp_path):
    with serving(tmp_path / "data", step_delay=0.005) as server:
        client = server.client()
        ids = []
        for prefix in ("a", "b"):
            f = client.files.create(file=("in.jsonl", batch_file(40, prefix=prefix)), purpose="batch")
            ids.append(client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id)
        wait_batch(client, ids[0], lambda b: b.status == "in_progress")
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            got = client.chat.completions.create(model="any", messages=[{"role": "user", "content": f"question {i}"}])
            answers[i] = got.choices[0].message.content

        askers = [threading.Thread(target=ask, args=(i,)) for i in range(100, 108)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(60)
        during = client.batches.retrieve(ids[1]).status
        batches = [wait_batch(client, batch_id, ended) for batch_id in ids]
        outputs = [records(client, b.output_file_id) for b in batches]
    assert answers == {i: f"answer {i}" for i in range(100, 108)}
    assert during in ("in_progress", "completed")  # the second batch ran beside the first, not after it
    assert [b.status for b in batches] == ["completed", "completed"]
    assert batches[1].in_progress_at <= batches[0].completed_at  # side by side
    for prefix, out in zip("ab", outputs):
        assert sorted(r["custom_id"] for r in out) == sorted(f"{prefix}{i}" for i in range(40))


def test_the_engine_never_holds_more_batch_lines_than_the_slots_left_to_online_requests(tmp_path):
    with serving(tmp_path / "data", n_parallel=4, online_slots=1, step_delay=0.005) as server:
        client = server.client()
        seen, stop = [], threading.Event()

        def sample() -> None:
            while not stop.wait(0.002):
                seen.append(server.engine.stats())

        sampler = threading.Thread(target=sample)
        sampler.start()
        f = client.files.create(file=("in.jsonl", batch_file(30)), purpose="batch")
        wait_batch(client, client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id,
                   ended)
        stop.set()
        sampler.join()
    assert server.service.inflight == 3
    busy = [s.slots_prefilling + s.slots_generating + s.queue_depth for s in seen]
    assert max(busy) == 3  # the batch used every slot it may, and never the one kept for online requests


def test_the_batch_lane_sends_only_the_slots_it_is_given_and_refills_as_lines_end():
    from llamabatch import Engine, EngineConfig, SamplingParams
    from llamabatch.serve.http.batches.batch_lane import BatchLane

    from fake_runner import FakeRunner

    runner = FakeRunner(n_slots=4, slot_ctx=128, n_batch=128, step_delay=0.005)
    with Engine(EngineConfig(n_parallel=4, n_batch=128, chunk_size=32, n_ctx=512), runner=runner) as engine:
        slots = [2]
        lane = BatchLane(engine, lambda: slots[0])
        params = SamplingParams(temperature=0, max_tokens=6)
        handles = [lane.submit(f"question {i}", params) for i in range(10)]
        assert sum(h.inner is not None for h in handles) == 2  # the rest wait in the lane, not the engine
        assert engine.stats().submitted == 2
        results = [h.result(30) for h in handles]
        assert all(r.finish_reason in ("stop", "length") for r in results)
        slots[0] = 1
        stopped = BatchLane(engine, lambda: slots[0])
        held = [stopped.submit(f"question {i}", params) for i in range(5)]
        stopped.stop()
        assert [h.result(30).finish_reason for h in held[1:]] == ["cancelled"] * 4  # never reached the engine
        assert held[0].result(30).finish_reason in ("stop", "length")  # already in the engine: it finishes
        late = stopped.submit("question 9", params)
        assert late.done and late.result().finish_reason == "cancelled"


def test_the_batch_lane_is_the_whole_engine_api_spelled_out_not_forwarded():
    # A job reads the engine through the lane; every member of api.EngineAPI is written on the
    # lane (no __getattr__ guessing), reads the engine's own value, and the job's `with` or
    # close never closes the service's engine.
    import inspect

    from llamabatch import Engine, EngineConfig, SamplingParams
    from llamabatch.api import EngineAPI
    from llamabatch.serve.http.batches.batch_lane import BatchLane

    from fake_runner import FakeRunner

    members = set(EngineAPI.__annotations__) | {n for n, _ in inspect.getmembers(EngineAPI, inspect.isfunction)
                                                 if not n.startswith("__") or n in ("__enter__", "__exit__")}
    assert "__getattr__" not in vars(BatchLane)
    assert not sorted(m for m in members if m not in vars(BatchLane)), "EngineAPI members the lane lacks"
    runner = FakeRunner(n_slots=2, slot_ctx=128, n_batch=128)
    with Engine(EngineConfig(n_parallel=2, n_batch=128, chunk_size=32, n_ctx=256), runner=runner) as engine:
        lane = BatchLane(engine, lambda: 2)
        for name in ("config", "model_name", "slot_ctx", "fatal_error", "restarts", "recovers_crashes", "disk"):
            assert getattr(lane, name) == getattr(engine, name), name
        with lane:
            results = lane.generate(["one", "two", "three"], SamplingParams(temperature=0, max_tokens=3))
        assert [r.finish_reason in ("stop", "length") for r in results] == [True] * 3
        assert lane.stats().finished == engine.stats().finished == 3
        lane.close()
        assert engine.submit("still open", SamplingParams(max_tokens=2)).result(30).ok
