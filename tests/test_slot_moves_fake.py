"""No holes between busy slots, against the scripted FakeRunner: with a KV stream per slot the
running requests stay on consecutive slots, the request on the highest busy slot moving into
an idle slot below it (plan.Move); moves are skipped when they do not pay, never made with one
shared cache or with slot_moves off, and a failed copy loses or repeats no token. The runner
checks every chunk against the KV it holds, so a move that lost or misplaced a cell shows."""
from __future__ import annotations

import itertools
import random

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams, TickRecord
from llamabatch.core.scheduling.kv_ledger import MOVE_MIN_LEFT, KVLedger, runs_of
from llamabatch.core.sequence import Status

from fake_runner import FakeRunner
from test_engine_fake import GREEDY, WAIT, assert_clean


def run(runner: FakeRunner, prompts: list[str], params: list[SamplingParams] | None = None, later: int = 0,
        **config):
    cfg = dict(n_parallel=runner.n_slots, n_batch=64, chunk_size=16, max_queue=0)
    cfg.update(config)
    runner.n_batch = cfg["n_batch"]
    ticks: list[TickRecord] = []
    with Engine(EngineConfig(**cfg), runner=runner, default_params=GREEDY.replace(max_tokens=64)) as engine:
        engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
        first = len(prompts) - later
        with engine.hold():  # all admitted in the first tick, in order: request i on slot i
            handles = [engine.submit(p, params[i] if params else None) for i, p in enumerate(prompts[:first])]
        handles += [engine.submit(p, params[first + i] if params else None) for i, p in enumerate(prompts[first:])]
        results = [h.result(WAIT) for h in handles]
        stats = engine.stats()
    return results, ticks, stats


def decode_slots(runner: FakeRunner) -> list[list[int]]:
    return [[c.slot for c in e.plan.chunks] for e in runner.plans if e.plan.chunks]


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_busy_slots_stay_consecutive_through_every_order_of_endings(order):
    # request i ends (max_tokens budget left far above the rule's) after 4 + 3 * order[i] tokens
    replies = {f"p{i}": "abcdefghijklmnopq"[:4 + 3 * order[i]] for i in range(4)}
    runner = FakeRunner(n_slots=4, slot_ctx=200, reply=lambda p: replies[p])
    results, ticks, stats = run(runner, list(replies))
    assert [r.text for r in results] == list(replies.values())
    assert_clean(runner)
    layouts = decode_slots(runner)
    assert all(runs_of(set(slots)) == 1 for slots in layouts), layouts
    assert all(t.ubatches == 1 for t in ticks), [t.ubatches for t in ticks]
    assert stats.moves == sum(t.moves for t in ticks) == len(runner.moves) == expected_moves(order)


def expected_moves(order: tuple[int, ...]) -> int:
    """Moves when request i (on slot i) ends order[i]-th: each ending that leaves a hole below
    the highest busy slot moves that slot's request into it."""
    slot_of = {i: i for i in range(len(order))}
    moves = 0
    for i in sorted(slot_of, key=lambda i: order[i]):
        del slot_of[i]
        busy = set(slot_of.values())
        holes = [s for s in range(min(busy, default=0), max(busy, default=0)) if s not in busy]
        if holes:
            top = max(slot_of, key=lambda j: slot_of[j])
            slot_of[top] = holes[0]
            moves += 1
    return moves


def test_a_move_skipped_when_the_answer_left_is_too_short_to_pay():
    replies = {"a": "x", "b": "y" * 30, "c": "z" * 30}
    for max_c, moves in ((MOVE_MIN_LEFT, 0), (MOVE_MIN_LEFT + 2, 1)):
        runner = FakeRunner(n_slots=3, slot_ctx=200, reply=lambda p: replies[p])
        params = [GREEDY, GREEDY.replace(max_tokens=64), GREEDY.replace(max_tokens=max_c)]
        results, _, stats = run(runner, ["b", "a", "c"], params)  # "a" on slot 1 ends first: a hole
        assert [r.text for r in results] == ["y" * 30, "x", "z" * max_c]
        assert stats.moves == moves and [m[:2] for m in runner.moves] == [(2, 1)] * moves
        assert_clean(runner)


@pytest.mark.parametrize("how", ["kv_unified", "slot_moves off", "no forks"])
def test_nothing_moves_with_one_shared_cache_or_moves_off(how):
    replies = {"a": "x", "b": "y" * 20, "c": "z" * 20}
    runner = FakeRunner(n_slots=3, slot_ctx=200, reply=lambda p: replies[p],
                        pool_cells=600 if how == "kv_unified" else None, can_fork=how != "no forks")
    config = {"slot_moves": False} if how == "slot_moves off" else {}
    if how == "kv_unified":
        config["kv_unified"] = True
    results, ticks, stats = run(runner, ["b", "a", "c"], **config)
    assert [r.text for r in results] == ["y" * 20, "x", "z" * 20]
    assert stats.moves == 0 and runner.moves == [] and all(t.moves == 0 for t in ticks)
    assert_clean(runner)


def test_a_failed_copy_evaluates_the_request_again_and_loses_no_token():
    replies = {"a": "x", "b": "y" * 20, "c": "z" * 20}
    runner = FakeRunner(n_slots=3, slot_ctx=200, reply=lambda p: replies[p], move_ok=lambda slot: False)
    results, _, stats = run(runner, ["b", "a", "c"])
    assert [r.text for r in results] == ["y" * 20, "x", "z" * 20]
    assert stats.moves == 1
    assert_clean(runner)


def test_the_ledger_never_moves_what_cannot_move():
    ledger = KVLedger(n_slots=6, slot_ctx=100)
    from llamabatch.core.sequence import Sequence

    def seat(slot: int, status: Status = Status.GENERATING, **kw) -> Sequence:
        seq = Sequence(request_id=slot, prompt=[1, 2, 3], params=SamplingParams(max_tokens=50), seed=0)
        seq.status, seq.kv.slot, seq.kv.num_computed = status, slot, 3
        for k, v in kw.items():
            setattr(seq, k, v)
        ledger.slots[slot].seq, ledger.slots[slot].cached = seq, [1, 2, 3]
        return seq

    seat(0)
    seat(5, Status.FORKING)
    seat(4, sampling_apart=True)
    seat(3)
    # 5 and 4 cannot move and 3 into 1 leaves as many runs ({0}, {1}, {4, 5}) as before: nothing
    assert ledger.plan_moves({0, 3, 4, 5}, MOVE_MIN_LEFT, 0.0) == []
    ledger.slots[5].seq = ledger.slots[4].seq = None
    moves = ledger.plan_moves({0, 3}, MOVE_MIN_LEFT, 0.0)
    assert [(m.src_slot, m.dst_slot, m.n_tokens) for m in moves] == [(3, 1, 3)]
    assert ledger.slots[1].seq.kv.slot == 1 and ledger.slots[3].seq is None
    assert ledger.slots[3].cached == ledger.slots[1].cached == [1, 2, 3]  # the source keeps its cells
    assert ledger.take_changes()[3] == moves


def test_moves_change_no_answer_with_forks_samples_prefixes_and_preemption():
    rng = random.Random(7)
    shared = "instruction shared by many prompts: "

    def reply(prompt: str, seed: int) -> str:
        r = random.Random(f"{prompt}/{seed}")
        return "".join(r.choice("abcdef") for _ in range(r.randint(1, 40)))

    prompts = [(shared if rng.random() < 0.5 else "") + f"item {i} " + "w" * rng.randint(0, 30) for i in range(24)]
    params = [GREEDY.replace(max_tokens=rng.choice([3, 8, 64]), n=rng.choice([1, 1, 1, 2]), seed=i,
                             priority=rng.choice([0, 0, 0, -1])) for i in range(24)]
    outcomes = {}
    for moves in (True, False):
        runner = FakeRunner(n_slots=6, slot_ctx=300, reply=reply)
        # the urgent ones of the second half arrive while the first half runs: some are put aside
        results, _, stats = run(runner, prompts, params, later=12, slot_moves=moves, share_prefix_min=8, n_batch=48,
                                chunk_size=8)
        assert_clean(runner)
        outcomes[moves] = [[s.text for s in r.samples] if r.samples else [r.text] for r in results], stats.moves
    assert outcomes[True][0] == outcomes[False][0]
    assert outcomes[True][1] > 0 and outcomes[False][1] == 0


def test_nothing_moves_into_or_out_of_the_reserved_slots():
    replies = {"a": "x" * 20, "b": "y", "c": "z" * 20, "u": "u" * 20}
    runner = FakeRunner(n_slots=4, slot_ctx=200, reply=lambda p: replies[p])
    params = [GREEDY.replace(max_tokens=64, priority=-1)] + [GREEDY.replace(max_tokens=64)] * 3
    results, _, stats = run(runner, ["u", "a", "b", "c"], params, reserved_slots=1)
    assert [r.text for r in results] == ["u" * 20, "x" * 20, "y", "z" * 20]
    assert [m[:2] for m in runner.moves] == [(2, 1)]  # "c" fills "b"'s hole; "u" keeps reserved slot 3
    assert any(3 in slots for slots in decode_slots(runner)[2:])
    assert_clean(runner)
