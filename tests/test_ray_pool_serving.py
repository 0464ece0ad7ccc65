"""The Ray pool as `serve --ray` uses it, on a local Ray instance whose workers run the scripted
fake runner at 50 ms a step ("slow"): --online-slots reserved on each worker's engine, and
what the header (and so a job's manifest) says of the workers."""
from __future__ import annotations

import json
import time

import pytest

from llamabatch import EngineConfig, SamplingParams
from child_tools import fake_gguf
from local_ray import local_ray
from supervised_child_runner import choice

pytestmark = [pytest.mark.xdist_group("ray_pool_serving"), pytest.mark.cluster]

BATCH = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)  # 1.5 s at 50 ms a step
ONLINE = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, priority=-1)  # serve's online priority
WAIT = 60.0


@pytest.fixture(scope="module")
def ray_session():
    with local_ray(num_cpus=2):
        yield


def start_pool(tmp_path, workers: int = 1, extra_slots: int = 0, runner: str = "slow"):
    from llamabatch.cluster.pool import RayPool

    config = EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, n_ctx=2048, threads=1)
    return RayPool.start(config, SamplingParams(max_tokens=8, temperature=0), address=None, workers=workers,
                         cpus_per_worker=1, gpus_per_worker=0, runner=choice(runner), extra_slots=extra_slots)


def steps(pool, index: int = 0) -> int:
    import ray

    return ray.get(pool._workers[index].actor.progress.remote())[0]


def online_beside_a_full_worker(pool):
    """Fill the one worker's batch slots (and its queue) with batch lines, then an online request:
    its Result, and the batch lines' Results."""
    batch = [pool.submit(f"batch line {i}", BATCH) for i in range(4)]  # its cap: 2 running, 2 queued
    deadline = time.monotonic() + WAIT
    while steps(pool) < 3:  # both batch slots decoding
        assert time.monotonic() < deadline, "the batch lines never started"
        time.sleep(0.05)
    online = pool.submit("online", ONLINE).result(timeout=WAIT)
    running = sum(not h.done for h in batch)
    return online, running, [h.result(timeout=WAIT) for h in batch]


def test_online_slots_are_reserved_on_each_worker_and_take_an_online_request_beside_full_batch_slots(
        ray_session, tmp_path):
    with start_pool(tmp_path, extra_slots=1) as pool:
        stats = pool.stats()
        assert (stats.n_parallel, stats.reserved_slots) == (3, 1)
        assert "1 engine(s) x 2 slots x 1024 tokens (+ 1 each for online requests)" in pool.describe()
        online, running, batch = online_beside_a_full_worker(pool)
    assert online.finish_reason == "length" and running == 4  # answered while every batch line still ran
    assert [r.finish_reason for r in batch] == ["length"] * 4
    assert [r.timings.preemptions for r in batch] == [0, 0, 0, 0]  # its own slot: no batch line set aside


def test_without_online_slots_the_online_request_sets_a_batch_line_aside(ray_session, tmp_path):
    with start_pool(tmp_path) as pool:
        assert (pool.stats().n_parallel, pool.stats().reserved_slots) == (2, 0)
        online, _, batch = online_beside_a_full_worker(pool)
    assert online.finish_reason == "length"
    assert sum(r.timings.preemptions for r in batch) == 1


def test_a_jobs_header_and_manifest_name_each_worker_and_its_node(ray_session, tmp_path):
    import ray

    from llamabatch import run_job

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"line {i}"}) + "\n" for i in range(6)))
    events = []
    with start_pool(tmp_path, workers=2, runner="fake") as pool:
        run_job(str(source), str(tmp_path / "out.jsonl"), engine=pool, on_event=events.append)
    node = next(n for n in ray.nodes() if n["Alive"])
    named = (f": w1 on {node['NodeManagerAddress']} (node {node['NodeID'][:12]}), "
             f"w2 on {node['NodeManagerAddress']} (node {node['NodeID'][:12]})")
    started = next(e for e in events if type(e).__name__ == "Started")
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert started.cluster.endswith(named) and started.cluster.startswith("fake, 2 engine(s) x 2 slots")
    assert manifest["ray"] == started.cluster


def test_a_conversations_turns_follow_its_prefix_to_one_worker_unless_it_is_busy(ray_session, tmp_path):
    system = "You are a terse assistant who answers in one word. " * 3
    turn = [system + "User: hi. Assistant: hello. " * i + f"User: question {i}." for i in range(3)]
    short = ONLINE
    long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True, priority=-1)  # 20 s: cancelled

    def served_by(pool, prompt) -> str:
        before = {w["name"]: w["lines"] for w in pool.worker_rows()}
        assert pool.submit(prompt, short).result(timeout=WAIT).finish_reason == "length"
        after = {w["name"]: w["lines"] for w in pool.worker_rows()}
        return next(name for name in after if after[name] > before[name])

    with start_pool(tmp_path, workers=2) as pool:  # 2 slots each: a worker may be 1 line longer
        assert served_by(pool, turn[0]) == "w1"  # nothing known: the shorter queue (a tie: the first)
        other = pool.submit("an unrelated long request " * 4, long)  # w1 again (a tie)
        assert served_by(pool, turn[1]) == "w1"  # its prefix ran there: w1 though w2 is idle
        same = pool.submit(turn[1] + " and more", long)  # on w1 too: 2 running there now, none on w2
        assert served_by(pool, turn[2]) == "w2"  # w1 is busy: not chosen
        for handle in (other, same):
            handle.cancel()
            assert handle.result(timeout=WAIT).finish_reason == "cancelled"
