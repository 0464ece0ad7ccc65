"""serve's --online-slots: slots for online requests on top of the batch's --n-parallel.

An online request that puts a batch line aside costs the batch more than its own rows: the
line ends out of step with the lines it started with, so its successor's prompt fills a tick of
its own. serve therefore opens its engine with the online slots added once n_parallel is
decided and reserved for requests above the default priority (settings.ready.with_extra_slots,
EngineConfig.reserved_slots), and the batch lane keeps its lines to the others.
"""
from __future__ import annotations

from llamabatch import EngineConfig
from llamabatch.core.telemetry import TickRecord
from llamabatch.engines import open_engine
from llamabatch.settings.ready import settings_for, with_extra_slots

from child_tools import fake_gguf
from cli_harness import fake_factory, runner_for
from http_server import CHAT, batch_file, ended, serving, wait_batch


def resolved(tmp_path, **config):
    return settings_for(EngineConfig(model=fake_gguf(tmp_path), **config))


def test_extra_slots_are_as_large_as_the_others(tmp_path):
    given = resolved(tmp_path, n_parallel=4, n_ctx=2048, n_batch=256)
    grown = with_extra_slots(given, 1)
    assert (grown.engine.n_parallel, grown.engine.n_ctx, grown.engine.slot_ctx) == (5, 2560, 512)
    assert grown.engine.slot_ctx == given.engine.slot_ctx
    assert grown.engine.reserved_slots == 1  # for requests above the default priority only
    unset = with_extra_slots(resolved(tmp_path, n_parallel=4), 2).engine
    assert (unset.n_parallel, unset.n_ctx, unset.slot_ctx) == (6, None, 4096)  # an unset n_ctx follows n_parallel
    assert with_extra_slots(resolved(tmp_path, n_parallel=8, n_batch=8), 1).engine.n_batch == 9
    assert with_extra_slots(given, 0) is given


def test_open_engine_adds_them_after_auto_has_chosen(tmp_path):
    engines: list = []
    factory = fake_factory(runner_for(), engines)
    with open_engine(EngineConfig(model=fake_gguf(tmp_path), n_parallel="auto", n_ctx=None), factory=factory,
                     max_slots=3, extra_slots=1) as engine:
        chosen = factory.slot_choices[-1][1]
        assert (engine.stats().n_parallel, engine.stats().reserved_slots) == (chosen + 1, 1)
        assert engine.stats().slot_ctx == 4096  # every slot, the added one too
    with open_engine(EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, n_ctx=1024), factory=factory) as engine:
        assert (engine.stats().n_parallel, engine.stats().slot_ctx) == (2, 512)  # none by default


def long_reply(prompt: str) -> str:
    return "and so on " * 40  # longer than max_tokens: every line holds its slot for its 60 ticks


def held_by_priority(engine) -> list[dict[int, int]]:
    """After every tick, the slots held by requests of each priority (read on the engine thread)."""
    seen: list[dict[int, int]] = []

    def count(record) -> None:
        if isinstance(record, TickRecord):
            held = [s.seq.params.priority for s in engine.scheduler.slots if s.seq is not None]
            seen.append({p: held.count(p) for p in set(held)})

    engine.subscribe(count)
    return seen


def batch_with_online_requests(server, lines: int) -> tuple[dict[int, str], object]:
    """A batch of `lines`; once its first line is answered, three online chats one after another."""
    client = server.client()
    f = client.files.create(file=("in.jsonl", batch_file(lines)), purpose="batch")
    batch_id = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
    wait_batch(client, batch_id, lambda b: b.status == "in_progress" and b.request_counts.completed >= 1)
    answers = {}
    for i in (100, 101, 102):
        got = client.chat.completions.create(model="any", messages=[{"role": "user", "content": f"question {i}"}],
                                             max_tokens=4)
        answers[i] = got.choices[0].message.content
    return answers, wait_batch(client, batch_id, ended)


def test_online_requests_take_the_reserved_slot_and_put_no_batch_line_aside(tmp_path):
    # the engine as serve opens it for --n-parallel 2 --online-slots 1: three slots, one reserved
    with serving(tmp_path / "data", n_parallel=3, reserved_slots=1, online_slots=1, step_delay=0.003,
                 reply_with=long_reply, max_tokens=60) as server:
        assert server.service.inflight == 4  # the batch's two slots, and a line queued behind each
        held = held_by_priority(server.engine)
        answers, batch = batch_with_online_requests(server, 16)
        stats = server.engine.stats()
    assert sorted(answers) == [100, 101, 102] and all(answers.values())
    assert batch.status == "completed" and batch.request_counts.completed == 16
    assert stats.preemptions == 0 and stats.reserved_slots == 1
    assert max(h.get(0, 0) for h in held) == 2  # batch lines never held the reserved slot...
    assert any(h.get(0) == 2 and h.get(-1) == 1 for h in held)  # ...and an online request ran beside two


def test_without_a_reserved_slot_an_online_request_puts_a_batch_line_aside(tmp_path):
    # the same on two slots with --online-slots 0: every slot the batch's
    with serving(tmp_path / "data", n_parallel=2, online_slots=0, step_delay=0.003, reply_with=long_reply,
                 max_tokens=60) as server:
        answers, batch = batch_with_online_requests(server, 16)
        stats = server.engine.stats()
    assert sorted(answers) == [100, 101, 102] and all(answers.values())
    assert batch.request_counts.completed == 16
    assert stats.preemptions >= 1
