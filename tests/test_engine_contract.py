"""One contract for the three engines behind llamabatch/api.py's EngineAPI:

- "engine": the in-process Engine with the scripted fake runner;
- "supervised": the SupervisedEngine with the same fake runner in its child (the model is a
  file that only starts like a GGUF: the child never opens it);
- "ray": the Ray pool (one worker) on a local Ray instance, the fake runner in the worker
  (the same registered runner as the child's), when Ray is installed.

Every engine here has 2 slots of 1024 tokens, and its fake runner takes 5 ms per step, so
a LONG request (400 tokens) runs for seconds and can be cancelled, timed out or closed on.
Most tests share one engine per kind (started once); the ones about max_queue and close()
get their own. Ray itself is started once for the module.
"""
from __future__ import annotations

import importlib.util
import threading
from typing import Any

import pytest

from llamabatch import Delta, EngineConfig, EngineStats, RequestRecord, Result, SamplingParams
from llamabatch.api import ChatEngine, EngineAPI, Handle
from llamabatch.errors import EngineClosed, QueueFull
from llamabatch.engines import Engine
from llamabatch.supervised import SupervisedEngine
import supervised_child_runner
from child_tools import child_env, fake_gguf
from fake_runner import N_VOCAB
from local_ray import local_ray

# One xdist worker runs the whole module: its engines (and Ray) start once, not once per worker.
pytestmark = pytest.mark.xdist_group("engine_contract")

KINDS = ["engine", "supervised"] + (["ray"] if importlib.util.find_spec("ray") is not None else [])
SHORT = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)  # ~2 s at 5 ms a step
WAIT = 60.0


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return fake_gguf(tmp_path_factory.mktemp("contract"))


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance for the module: its workers can import the registered fake runner."""
    with local_ray(num_cpus=2):
        yield


def open_engine(kind: str, model_file: str, request: pytest.FixtureRequest, max_queue: int = 0) -> Any:
    # a q8_0 KV cache: the settings cross the child's and Ray's wire like every other (the fake
    # runner has no cache; tests/test_kv_cache_types_model.py runs q8_0 on both real models)
    config = EngineConfig(model=model_file, n_parallel=2, n_ctx=2048, threads=1, max_queue=max_queue,
                          cache_type_k="q8_0", cache_type_v="q8_0")
    if kind == "engine":
        return Engine(config, runner=supervised_child_runner.fake(config), default_params=SHORT)
    if kind == "supervised":
        return SupervisedEngine(config, default_params=SHORT, env=child_env(), runner=supervised_child_runner.choice(),
                                watchdog_s=0)
    request.getfixturevalue("ray_session")
    from llamabatch.cluster.pool import RayPool

    return RayPool.start(config, SHORT, address=None, workers=1, cpus_per_worker=1, gpus_per_worker=0,
                         runner=supervised_child_runner.choice())


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def shared(kind, model_file, request):
    """One engine of this kind for the tests that leave it as they found it."""
    engine = open_engine(kind, model_file, request)
    yield engine
    engine.close()


@pytest.fixture
def fresh(kind, model_file, request):
    """An engine of this kind of the test's own, closed at the end: `fresh(max_queue=...)`."""
    opened = []

    def make(max_queue: int = 0):
        opened.append(open_engine(kind, model_file, request, max_queue))
        return opened[-1]

    yield make
    for engine in opened:
        engine.close()


class Events:
    """What a callback saw, per request: Deltas and Results in order."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen: dict[int, list] = {}

    def __call__(self, handle: Handle, item: Delta | Result) -> None:
        with self.lock:
            self.seen.setdefault(handle.request_id, []).append(item)

    def results(self, request_id: int) -> list[Result]:
        with self.lock:
            return [x for x in self.seen.get(request_id, []) if isinstance(x, Result)]


def test_it_is_an_engine_and_healthy(shared, kind):
    assert isinstance(shared, EngineAPI)
    assert isinstance(shared, ChatEngine) == (kind != "ray")  # the pool's model lives on its workers only
    assert shared.config.n_parallel == 2 and shared.default_params == SHORT
    assert shared.fatal_error is None
    assert (shared.restarts, shared.hangs, list(shared.isolated)) == (0, 0, [])
    assert isinstance(shared.recovers_crashes, bool)
    assert isinstance(shared.model_name, str) and shared.model_name
    assert shared.slot_ctx == 1024
    assert isinstance(shared.kernels, str) and isinstance(shared.slots_reason, str)


def test_generate_returns_results_in_input_order(shared):
    prompts = ["a", "bb", "ccc", "dddd", "eeeee"]
    results = shared.generate(prompts)
    assert [r.text[:len(p) + 1] for r, p in zip(results, prompts)] == [p + "!" for p in prompts]  # the fake echoes
    assert all(r.finish_reason == "length" and r.usage.completion_tokens == 8 for r in results)
    ids = [r.request_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    per = shared.generate(["x", "y"], [SHORT.replace(max_tokens=2), SHORT.replace(max_tokens=3)])
    assert [r.text for r in per] == ["x!", "y!~"]


def test_a_handle_streams_deltas_and_ends_with_exactly_one_result(shared):
    events = Events()
    handle = shared.submit("stream me", SHORT, stream=True, callback=events)
    assert isinstance(handle, Handle)
    deltas = list(handle)  # ends when the Result is there
    result = handle.result(WAIT)
    assert handle.done and result.request_id == handle.request_id
    assert "".join(d.text for d in deltas) == result.text == "stream m"
    seen = events.seen[handle.request_id]
    assert [type(x) for x in seen].count(Result) == 1 and seen[-1] is result
    assert "".join(x.text for x in seen if isinstance(x, Delta)) == result.text


def test_cancel_ends_the_request_cancelled_once(shared):
    events = Events()
    handle = shared.submit("cancel me", LONG, stream=False, callback=events)
    handle.cancel()
    result = handle.result(WAIT)
    assert result.finish_reason == "cancelled" and result.request_id == handle.request_id
    handle.cancel()  # after the outcome: nothing happens
    assert events.results(handle.request_id) == [result]


def test_a_request_past_its_timeout_ends_timeout(shared):
    result = shared.submit("too slow", LONG.replace(timeout=0.3), stream=False).result(WAIT)
    assert result.finish_reason == "timeout"


def test_bad_input_ends_its_own_request_with_an_error(shared):
    events = Events()
    handle = shared.submit([N_VOCAB + 10], SHORT, callback=events)  # a token id past the vocabulary
    result = handle.result(WAIT)
    assert result.finish_reason == "error" and result.error_code == "invalid_request" and result.error
    assert events.results(handle.request_id) == [result]
    assert shared.generate(["still fine"])[0].finish_reason == "length"


def test_tokenize(shared):
    assert shared.tokenize("hi") == [ord("h"), ord("i")]


def test_stats_and_subscribe_shapes(shared):
    records: list[Any] = []
    unsubscribe = shared.subscribe(records.append)
    before = shared.stats()
    assert isinstance(before, EngineStats) and set(before.to_dict()) == set(EngineStats().to_dict())
    assert (before.n_parallel, before.slot_ctx) == (2, 1024)
    result = shared.generate(["count me"])[0]
    after = shared.stats()
    unsubscribe()
    assert after.submitted - before.submitted == 1 and after.finished - before.finished == 1
    assert after.generated_tokens - before.generated_tokens == 8
    assert after.slots_idle + after.slots_prefilling + after.slots_generating == 2
    done = [r for r in records if isinstance(r, RequestRecord) and r.kind == "done"]
    assert [(r.request_id, r.finish_reason) for r in done] == [(result.request_id, "length")]
    shared.generate(["after unsubscribing"])
    assert not [r for r in records if isinstance(r, RequestRecord) and r.kind == "done"][1:]


def test_max_queue_refuses_past_slots_plus_queue_and_counts_only_what_it_took(fresh):
    engine = fresh(max_queue=1)
    taken = [engine.submit(f"long {i}", LONG, stream=False) for i in range(3)]  # 2 slots + 1 waiting
    with pytest.raises(QueueFull):
        engine.submit("one too many", LONG, stream=False)
    assert engine.stats().submitted == 3
    for handle in taken:
        handle.cancel()
    assert [h.result(WAIT).finish_reason for h in taken] == ["cancelled"] * 3
    # generate waits for room instead: 5 prompts through 3 places
    results = engine.generate([f"p{i}" for i in range(5)])
    assert [r.text[:3] for r in results] == [f"p{i}!" for i in range(5)]
    assert engine.stats().submitted == 8


def test_close_ends_every_pending_request_once_and_refuses_new_ones(fresh):
    engine = fresh()
    events = Events()
    handles = [engine.submit(f"pending {i}", LONG, stream=False, callback=events) for i in range(4)]
    engine.close()
    assert all(h.done for h in handles)
    assert [h.result(0).finish_reason for h in handles] == ["cancelled"] * 4
    assert all(len(events.results(h.request_id)) == 1 for h in handles)
    assert engine.stats().cancelled == 4
    with pytest.raises(EngineClosed):
        engine.submit("after close", SHORT)
    engine.close()  # a second close is harmless
    assert all(len(events.results(h.request_id)) == 1 for h in handles)


def test_a_chat_engine_renders_chat_messages_with_its_models_template(shared):
    if isinstance(shared, ChatEngine):
        text = shared.render_chat([{"role": "user", "content": "hello there"}])
        assert "hello there" in text and shared.chat_template is not None
    else:  # the Ray pool: the template lives with the model, on the workers
        assert not hasattr(shared, "render_chat")


def test_embeddings_are_served_or_refused_in_one_line(shared, kind):
    from fake_runner import fake_embedding, text_tokens
    from llamabatch.core.engine_base import EmbeddingFailed
    from llamabatch.results import EmbeddingResult

    events = Events()
    handle = shared.submit_embedding(["ab", "cde"], normalize=False, callback=events)
    result = handle.result(WAIT)
    assert isinstance(result, EmbeddingResult)
    if kind == "ray":  # documented: the pool serves no embeddings, each request says so
        assert result.finish_reason == "error" and result.error_code == "unsupported" and "\n" not in result.error
        with pytest.raises(EmbeddingFailed, match="not served by RayPool"):
            shared.embed("x")
        return
    assert result.ok and result.vectors == [fake_embedding(text_tokens(t), "mean") for t in ("ab", "cde")]
    assert shared.submit_embedding("").result(WAIT).finish_reason == "error"
    assert [e.index for e in shared.embed(["a", "b", "c"])] == [0, 1, 2]
    seen = events.seen[handle.request_id]
    assert len(seen) == 1 and seen[0].finish_reason == "stop"  # one terminal event, no deltas
