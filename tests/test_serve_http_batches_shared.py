"""Batches side by side in `llamabatch serve`: every unfinished batch runs at once, sharing the
engine's batch places (batch_share.py), each answering every line of its own exactly once; a
small batch created beside a big one is not starved; cancelling one leaves the other whole; a
kill -9 with two batches in the middle resumes both; --max-concurrent-batches 1 is the old
one-at-a-time order; /metrics shows each running batch's own figures. In-process servers on the scripted fake runner, and real processes
(tests/fake_cli.py) for the kill."""
from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

from llamabatch.openai_format import error_result
from llamabatch.serve.http.batches.batch_lane import BatchLane
from llamabatch.serve.http.batches.batch_share import BatchShare

from http_server import CHAT, batch_file, ended, records, serving, wait_batch
from test_serve_http_restart import lines_file, start_server


def _create(client, n: int, prefix: str) -> str:
    f = client.files.create(file=("in.jsonl", batch_file(n, prefix=prefix)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id


def _answered_once(client, batch, prefix: str, n: int) -> None:
    outputs = records(client, batch.output_file_id)
    assert batch.status == "completed", batch
    assert sorted(r["custom_id"] for r in outputs) == sorted(f"{prefix}{i}" for i in range(n))  # each once
    for r in outputs:  # its own answer, not another batch's
        assert r["response"]["body"]["choices"][0]["message"]["content"] == f"answer {r['custom_id'][1:]}"


def test_two_batches_share_the_engine_and_each_answers_every_line_once(tmp_path):
    with serving(tmp_path / "data", step_delay=0.005) as server:
        client = server.client()
        ids = [_create(client, 60, "a"), _create(client, 60, "b")]
        both = wait_batch(client, ids[1], lambda b: b.status == "in_progress" or ended(b))
        first = client.batches.retrieve(ids[0])
        lanes_seen = len(server.service.running_batch_lanes())
        done = [wait_batch(client, batch_id, ended) for batch_id in ids]
        for batch, prefix in zip(done, "ab"):
            _answered_once(client, batch, prefix, 60)
        assert server.service.running_batch_lanes() == {} and server.service.share.lanes == 0
        assert server.service.share.sent == 0  # every place given back
    assert both.status == "in_progress" and first.status == "in_progress"  # side by side, not one after the other
    assert lanes_seen == 2


def test_a_small_batch_created_beside_a_big_one_finishes_long_before_it(tmp_path):
    with serving(tmp_path / "data", step_delay=0.01) as server:
        client = server.client()
        big = _create(client, 120, "b")
        wait_batch(client, big, lambda b: b.request_counts.completed >= 8)
        started = time.monotonic()
        small = wait_batch(client, _create(client, 6, "s"), ended)
        small_s = time.monotonic() - started
        big_then = client.batches.retrieve(big)
        _answered_once(client, small, "s", 6)
        _answered_once(client, wait_batch(client, big, ended, timeout=120), "b", 120)
        big_s = time.monotonic() - started
    assert big_then.status == "in_progress" and big_then.request_counts.completed < 90, big_then.request_counts
    assert small_s < big_s / 4, (small_s, big_s)


def test_cancelling_one_batch_leaves_the_other_whole(tmp_path):
    with serving(tmp_path / "data", step_delay=0.01) as server:
        client = server.client()
        kept, cancelled = _create(client, 80, "k"), _create(client, 80, "c")
        wait_batch(client, cancelled, lambda b: b.request_counts.completed >= 3)
        client.batches.cancel(cancelled)
        stopped = wait_batch(client, cancelled, ended)
        running = client.batches.retrieve(kept)
        _answered_once(client, wait_batch(client, kept, ended), "k", 80)
        partial = records(client, stopped.output_file_id)
    assert running.status == "in_progress"  # the cancel stopped only its own batch
    assert stopped.status == "cancelled" and 3 <= len(partial) < 80
    assert len({r["custom_id"] for r in partial}) == len(partial) == stopped.request_counts.completed


def test_max_concurrent_batches_1_runs_them_one_at_a_time_in_order(tmp_path):
    with serving(tmp_path / "data", step_delay=0.005, max_concurrent_batches=1) as server:
        client = server.client()
        lanes: list[int] = []  # batches running at once, sampled every few ms from the first create on
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                lanes.append(len(server.service.running_batch_lanes()))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ids = [_create(client, 30, p) for p in "xyz"]
        wait_batch(client, ids[0], lambda b: b.request_counts.completed >= 1)
        waiting = [client.batches.retrieve(i).status for i in ids[1:]]
        done = []
        for batch_id, prefix in zip(ids, "xyz"):
            done.append(wait_batch(client, batch_id, ended))
            _answered_once(client, done[-1], prefix, 30)
        sampling.set()
        sampler.join()
    assert waiting == ["validating", "validating"]
    assert max(lanes) == 1  # one at a time, and seen running
    assert done[0].completed_at <= done[1].in_progress_at and done[1].completed_at <= done[2].in_progress_at


def test_kill_9_with_two_batches_mid_way_then_restart_resumes_both_each_line_once(tmp_path):
    data_dir = tmp_path / "data"
    proc, client = start_server(tmp_path, data_dir)  # the "slow" fake: 50 ms a step
    try:
        ids = []
        for _ in range(2):
            f = client.files.create(file=("in.jsonl", lines_file(40)), purpose="batch")
            ids.append(client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id)
        for batch_id in ids:
            wait_batch(client, batch_id, lambda b: b.request_counts.completed >= 4)
        mid = [client.batches.retrieve(i) for i in ids]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc, client = start_server(tmp_path, data_dir, "fake", "--max-concurrent-batches", "2")
        done = [wait_batch(client, i, ended, timeout=120) for i in ids]
        both = [(records(client, b.output_file_id), records(client, b.error_file_id)) for b in done]
    finally:
        proc.kill()
        proc.wait(10)
    assert [b.status for b in mid] == ["in_progress", "in_progress"]
    assert all(b.request_counts.completed < 39 for b in mid)  # both were in the middle when killed
    for batch, (outputs, errors) in zip(done, both):
        assert sorted(r["custom_id"] for r in outputs + errors) == sorted(f"r{i}" for i in range(40))
        assert [r["custom_id"] for r in errors] == ["r5"]
        assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 39, 1)


class _ManualEngine:
    """Takes lines and ends them only when told: which lane got each place is then exact."""

    def __init__(self):
        self.sent: list[tuple[str, object]] = []

    def submit(self, prompt, params=None, *, stream=False, callback=None):
        self.sent.append((prompt, callback))
        return SimpleNamespace(cancel=lambda: None)

    def end(self, prompt: str) -> None:
        i = next(i for i, (p, _) in enumerate(self.sent) if p == prompt)
        _, callback = self.sent.pop(i)
        callback(None, error_result("x", "ended by the test"))

    def lanes_in(self) -> list[str]:
        return [p[0] for p, _ in self.sent]


def test_a_freed_place_goes_to_the_waiting_lane_that_took_fewest_ties_in_turn():
    engine, places = _ManualEngine(), [4]
    share = BatchShare(lambda: places[0])
    big, small = BatchLane(engine, share), BatchLane(engine, share)
    for i in range(20):
        big.submit(f"b{i}")
    assert engine.lanes_in() == ["b"] * 4  # alone, the big batch takes every place
    for i in range(3):
        small.submit(f"s{i}")
    assert engine.lanes_in() == ["b"] * 4  # no place free: the small one waits for the next
    engine.end("b0")
    engine.end("b1")
    # owed the big one's 2 lines queued ahead of it: both freed places went to the small one
    assert sorted(engine.lanes_in()) == ["b", "b", "s", "s"]
    engine.end("b2")
    assert sorted(engine.lanes_in()) == ["b", "b", "s", "s"]  # 1 b against 2 s: the big one's turn
    engine.end("s0")
    engine.end("s1")
    assert sorted(engine.lanes_in()) == ["b", "b", "b", "s"]  # the small one's last line, then the big one's
    third = BatchLane(engine, share)
    third.submit("t0")
    small.stop()
    engine.end("s2")  # the small batch is done and holds nothing: its place goes to the third
    assert sorted(engine.lanes_in()) == ["b", "b", "b", "t"]
    places[0] = 6  # the service gives batches more places: taken on the next hand-out
    share.feed()
    assert sorted(engine.lanes_in()) == ["b"] * 5 + ["t"]
    small.close()
    assert share.lanes == 2 and share.sent == 6


def test_a_lane_idle_for_a_while_takes_its_turn_again_not_every_place_it_missed():
    engine = _ManualEngine()
    share = BatchShare(lambda: 2)
    a, b = BatchLane(engine, share), BatchLane(engine, share)
    a.submit("a0")
    for i in range(30):
        b.submit(f"b{i}")
    engine.end("a0")
    for _ in range(20):  # a has nothing to send: b takes every place
        engine.end(next(p for p, _ in engine.sent if p.startswith("b")))
    for i in range(1, 5):
        a.submit(f"a{i}")
    got = []
    for _ in range(6):
        ended_first = engine.sent[0][0]
        engine.end(ended_first)
        got.append(engine.sent[-1][0][0])
    assert got.count("a") == 3, got  # by turns with b, not a's 20 missed turns at once


def test_lanes_submitting_from_their_own_threads_while_lines_end_give_back_every_place():
    # as in the server: each batch's job submits from its thread, the engine ends lines on its own
    engine, lock = _ManualEngine(), threading.Lock()
    share = BatchShare(lambda: 3)
    lanes = [BatchLane(engine, share) for _ in range(4)]
    handles: list = []
    most = [0]

    def submit_all(k: int) -> None:
        for i in range(25):
            with lock:  # the engine's own lock around its queue
                handles.append(lanes[k].submit(f"{k}-{i}"))

    def end_lines() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(handles) < 100 or not all(h.done for h in handles)):
            with lock:
                most[0] = max(most[0], len(engine.sent))
                if engine.sent:
                    engine.end(engine.sent[0][0])

    threads = [threading.Thread(target=submit_all, args=(k,)) for k in range(4)] + [threading.Thread(target=end_lines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(handles) == 100 and all(h.done for h in handles)
    assert most[0] == 3  # never more lines in the engine than the places
    assert share.sent == 0 and all(lane.sent == 0 for lane in lanes)


def test_metrics_show_each_running_batchs_own_figures(tmp_path):
    from test_serve_http_metrics import _scrape, _value

    with serving(tmp_path / "data", step_delay=0.01) as server:
        base = server.base_url.removesuffix("/v1")
        client = server.client()
        ids = [_create(client, 60, "a"), _create(client, 40, "b")]
        speeds: dict[str, float] = {}
        totals: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(speeds) < 2:
            samples = _scrape(base)
            for batch_id in ids:
                totals[batch_id] = max(totals.get(batch_id, 0), _value(samples, "llamabatch:batch_lines",
                                                                        batch_id=batch_id))
                speed = _value(samples, "llamabatch:batch_generation_tokens_per_second", batch_id=batch_id)
                if speed > 0:
                    speeds[batch_id] = speed
            time.sleep(0.05)
        for batch_id in ids:
            wait_batch(client, batch_id, ended)
    assert sorted(speeds) == sorted(ids)  # both running at once, each with its own tokens/s
    assert totals == {ids[0]: 60, ids[1]: 40}
