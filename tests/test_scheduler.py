"""The scheduler driven by hand-made runner outputs: admission, prefix choice, chunked
prefill accounting, stops. No model, no engine thread."""
from __future__ import annotations

from llamabatch.params import SamplingParams
from llamabatch.core.plan import StepPlan, StepResult
from llamabatch.core.scheduling.scheduler import Scheduler
from llamabatch.core.sequence import Sequence, Status

from fake_runner import EOG, byte_tokens, text_tokens, token_piece

GREEDY = SamplingParams(temperature=0, max_tokens=50)


def make_scheduler(n_slots: int = 2, slot_ctx: int = 1000, n_batch: int = 512, chunk_size: int = 256,
                   policy: str = "decode-maximal", cache_prompt: bool = True) -> Scheduler:
    return Scheduler(n_slots, slot_ctx, n_batch, chunk_size, policy, cache_prompt, token_piece, lambda t: t == EOG)


_ids = iter(range(10**6))


def make_seq(prompt: str | list[int], params: SamplingParams = GREEDY) -> Sequence:
    tokens = text_tokens(prompt) if isinstance(prompt, str) else list(prompt)
    return Sequence(next(_ids), tokens, params, seed=0)


def admit_all(sched: Scheduler) -> list[tuple[Sequence, int, int]]:
    """Admit like the engine does, with a runner that keeps every reusable token.
    Returns (seq, slot, reused tokens) per admission."""
    admitted = sched.admit()
    for seq, slot, reuse, _fork in admitted:
        sched.start(seq, slot, reuse)
    return [(a.seq, a.slot, a.reuse) for a in admitted]


def step(sched: Scheduler, tokens: dict[int, int] | None = None):
    """One tick: schedule, 'evaluate', sample `tokens[request_id]` (default 'x') where logits are wanted."""
    plan = sched.schedule()
    sampled = {}
    for c in plan.chunks:
        if c.wants_logits:
            sampled[c.slot] = (tokens or {}).get(c.request_id, ord("x"))
    events = sched.update(plan, StepResult(sampled=sampled))
    return plan, events


def run_to_first_token(sched: Scheduler, seq: Sequence, token: int = ord("x")):
    while seq.status == Status.PREFILLING:
        step(sched, {seq.request_id: token})


# -- admission -----------------------------------------------------------------------------

def test_admission_is_fifo_and_fills_only_idle_slots():
    sched = make_scheduler(n_slots=3)
    seqs = [make_seq(f"prompt {i}") for i in range(5)]
    for s in seqs:
        sched.add(s)
    admitted = admit_all(sched)
    assert [s for s, _, _ in admitted] == seqs[:3]
    assert sorted(slot for _, slot, _ in admitted) == [0, 1, 2]
    assert list(sched.waiting) == seqs[3:]
    assert admit_all(sched) == []  # no idle slot
    sched.finish(seqs[1], "cancelled")
    again = admit_all(sched)
    assert [(s, slot) for s, slot, _ in again] == [(seqs[3], seqs[1].kv.slot)]
    assert list(sched.waiting) == [seqs[4]]


def test_finishing_a_waiting_sequence_removes_it_from_the_queue():
    sched = make_scheduler(n_slots=1)
    a, b, c = make_seq("a"), make_seq("b"), make_seq("c")
    for s in (a, b, c):
        sched.add(s)
    admit_all(sched)
    sched.finish(b, "cancelled")
    assert list(sched.waiting) == [c]
    assert b.finished and b.answer.finish_reason == "cancelled"


def test_start_sets_accounting_from_the_kept_prefix():
    sched = make_scheduler(n_slots=1)
    seq = make_seq("hello world")
    sched.add(seq)
    (s, slot, reuse, _), = sched.admit()
    sched.start(s, slot, 0)
    assert seq.status == Status.PREFILLING and seq.kv.slot == slot
    assert seq.kv.num_computed == seq.kv.num_cached == 0
    assert seq.num_pending == len("hello world")


# -- prefix choice ---------------------------------------------------------------------------

def finish_one(sched: Scheduler, prompt: str, reply: str = "") -> Sequence:
    """Run `prompt` through a free slot to completion, leaving its tokens cached there."""
    seq = make_seq(prompt)
    sched.add(seq)
    admit_all(sched)
    for ch in reply:
        step(sched, {seq.request_id: ord(ch)})
    step(sched, {seq.request_id: EOG})
    assert seq.finished
    return seq


def test_new_request_takes_the_slot_with_the_longest_shared_prefix():
    sched = make_scheduler(n_slots=3)
    first = finish_one(sched, "the cat sat on the mat")
    second = finish_one(sched, "a dog ran in the park")
    assert first.kv.slot != second.kv.slot
    follow = make_seq("a dog ran in the park and then slept")
    sched.add(follow)
    (_, slot, reuse), = admit_all(sched)
    assert slot == second.kv.slot
    assert reuse == len("a dog ran in the park")
    assert follow.kv.num_cached == follow.kv.num_computed == reuse
    plan, _ = step(sched)
    (chunk,) = plan.chunks
    assert chunk.start_pos == reuse
    assert chunk.tokens == text_tokens(" and then slept")


def test_generated_tokens_count_towards_the_prefix_a_follow_up_can_reuse():
    sched = make_scheduler(n_slots=2)
    first = finish_one(sched, "Q: 2+2? A:", reply=" 4.")
    # The slot holds the prompt and every generated token that was fed back (the tick
    # that sampled EOG evaluated "."; EOG itself never enters the cache).
    assert sched.slots[first.kv.slot].cached == text_tokens("Q: 2+2? A: 4.")
    follow = make_seq("Q: 2+2? A: 4. Q: 3+3? A:")
    sched.add(follow)
    (_, slot, reuse), = admit_all(sched)
    assert slot == first.kv.slot and reuse == len("Q: 2+2? A: 4.")


def test_no_shared_prefix_goes_to_the_least_recently_used_slot():
    sched = make_scheduler(n_slots=2)
    a = finish_one(sched, "aaaa")
    b = finish_one(sched, "bbbb")
    assert sched.slots[a.kv.slot].last_used < sched.slots[b.kv.slot].last_used
    new = make_seq("zzzz")
    sched.add(new)
    (_, slot, reuse), = admit_all(sched)
    assert (slot, reuse) == (a.kv.slot, 0)


def test_identical_prompt_still_evaluates_its_last_token():
    sched = make_scheduler(n_slots=1)
    finish_one(sched, "same prompt", reply="yz")
    again = make_seq("same prompt")
    sched.add(again)
    (_, _, reuse), = admit_all(sched)
    assert reuse == len("same prompt") - 1
    plan, events = step(sched)
    (chunk,) = plan.chunks
    assert chunk.tokens == text_tokens("t") and chunk.wants_logits
    assert again.status == Status.GENERATING and again.answer.output == [ord("x")]


def test_cache_prompt_off_reuses_nothing():
    sched = make_scheduler(n_slots=1, cache_prompt=False)
    finish_one(sched, "shared prefix here")
    again = make_seq("shared prefix here too")
    sched.add(again)
    (_, _, reuse), = admit_all(sched)
    assert reuse == 0


def test_kept_prefix_smaller_than_asked_is_what_counts():
    """The runner may keep less than the scheduler hoped (an unsupported partial trim)."""
    sched = make_scheduler(n_slots=1)
    finish_one(sched, "abcdefgh")
    again = make_seq("abcdefgh ijk")
    sched.add(again)
    (seq, slot, reuse, _), = sched.admit()
    assert reuse == 8
    sched.start(seq, slot, 0)  # the runner reset the slot
    assert sched.slots[slot].cached == []
    plan, _ = step(sched)
    assert plan.chunks[0].start_pos == 0 and plan.chunks[0].tokens == text_tokens("abcdefgh ijk")
    assert again.kv.num_cached == 0


# -- chunked prefill -------------------------------------------------------------------------

def test_long_prompt_is_prefilled_in_chunks_and_only_the_last_wants_logits():
    sched = make_scheduler(n_slots=1, chunk_size=256, n_batch=512)
    seq = make_seq([7] * 600)
    sched.add(seq)
    admit_all(sched)
    sizes, starts, logits = [], [], []
    while seq.status == Status.PREFILLING:
        plan, _ = step(sched)
        (chunk,) = plan.chunks
        sizes.append(len(chunk.tokens))
        starts.append(chunk.start_pos)
        logits.append(chunk.wants_logits)
    assert sizes == [256, 256, 88]
    assert starts == [0, 256, 512]
    assert logits == [False, False, True]
    assert seq.kv.num_computed == 600 and seq.answer.output == [ord("x")]
    # the next tick feeds the sampled token back at position 600
    plan, _ = step(sched)
    (chunk,) = plan.chunks
    assert chunk.is_decode and chunk.tokens == [ord("x")] and chunk.start_pos == 600 and chunk.wants_logits


def test_prefills_share_the_budget_in_admission_order_with_decodes_first():
    sched = make_scheduler(n_slots=3, chunk_size=256, n_batch=300)
    gen = make_seq("g")
    sched.add(gen)
    admit_all(sched)
    step(sched)  # gen is now generating
    a, b = make_seq([5] * 400), make_seq([6] * 400)
    sched.add(a)
    sched.add(b)
    admit_all(sched)
    plan, _ = step(sched)
    got = [(c.request_id, len(c.tokens), c.is_decode) for c in plan.chunks]
    assert got == [(gen.request_id, 1, True), (a.request_id, 256, False), (b.request_id, 43, False)]
    assert plan.n_tokens == 300
    plan, _ = step(sched)
    got = [(c.request_id, len(c.tokens)) for c in plan.chunks]
    assert got == [(gen.request_id, 1), (a.request_id, 144), (b.request_id, 155)]
    assert a.status == Status.GENERATING and b.status == Status.PREFILLING
    assert b.kv.num_computed == 43 + 155


def test_chunk_evaluated_while_its_sequence_was_cancelled_is_ignored():
    sched = make_scheduler(n_slots=1)
    seq = make_seq("abc")
    sched.add(seq)
    admit_all(sched)
    plan = sched.schedule()
    sched.finish(seq, "cancelled")
    events = sched.update(plan, StepResult(sampled={seq.kv.slot: ord("x")}))
    assert events == [] and seq.answer.output == []


# -- stops -----------------------------------------------------------------------------------

def generate(sched: Scheduler, seq: Sequence, tokens: list[int]):
    """Feed `tokens` as the sampled tokens until the sequence finishes; return (events, deltas)."""
    sched.add(seq)
    admit_all(sched)
    events = []
    for tok in tokens:
        if seq.finished:
            break
        _, evs = step(sched, {seq.request_id: tok})
        events += evs
    return events, "".join(e.text for e in events)


def test_eog_ends_with_stop_and_is_not_part_of_the_answer():
    sched = make_scheduler()
    seq = make_seq("hi")
    events, text = generate(sched, seq, text_tokens("yo") + [EOG, ord("z")])
    assert seq.answer.finish_reason == "stop" and seq.answer.stop_hit is None
    assert seq.answer.output == text_tokens("yo")
    assert text == seq.answer.text == "yo"
    assert events[-1].finished and sum(e.finished for e in events) == 1
    assert all(s.seq is None for s in sched.slots)


def test_an_eog_that_comes_out_despite_ignore_eos_still_ends_the_request():
    # The runner bans EOG for ignore_eos; one sampled anyway means a grammar allowed
    # nothing else, so feeding it back and carrying on would only repeat EOG.
    sched = make_scheduler()
    seq = make_seq("hi", GREEDY.replace(ignore_eos=True, max_tokens=5))
    generate(sched, seq, [ord("a"), EOG, ord("b"), ord("c")])
    assert seq.answer.finish_reason == "stop" and seq.answer.output == [ord("a")] and seq.answer.text == "a"


def test_stop_string_split_across_tokens_is_found_and_never_leaks():
    sched = make_scheduler()
    seq = make_seq("hi", GREEDY.replace(stop=["END"]))
    events, text = generate(sched, seq, text_tokens("one E") + text_tokens("N") + text_tokens("D more"))
    assert seq.answer.finish_reason == "stop" and seq.answer.stop_hit == "END"
    assert text == seq.answer.text == "one "
    # "E" and "N" were held back while they could still start "END"
    assert [e.text for e in events] == ["o", "n", "e", " ", "", "", ""]


def test_stop_prefix_that_does_not_complete_is_released():
    sched = make_scheduler()
    seq = make_seq("hi", GREEDY.replace(stop=["END"], max_tokens=4))
    events, text = generate(sched, seq, text_tokens("ENDx")[:2] + text_tokens("!?"))
    assert seq.answer.finish_reason == "length"
    assert text == seq.answer.text == "EN!?"


def test_max_tokens_ends_with_length_and_releases_held_text():
    sched = make_scheduler()
    seq = make_seq("hi", GREEDY.replace(max_tokens=3, stop=["cd"]))
    events, text = generate(sched, seq, text_tokens("abcz"))
    assert seq.answer.finish_reason == "length" and seq.answer.output == text_tokens("abc")
    assert text == seq.answer.text == "abc"  # the held "c" came out at the end


def test_full_slot_context_ends_with_length():
    sched = make_scheduler(n_slots=1, slot_ctx=12)
    seq = make_seq("0123456789", GREEDY.replace(max_tokens=100))
    generate(sched, seq, text_tokens("abcdef"))
    assert seq.answer.finish_reason == "length"
    assert seq.num_tokens == 12 and seq.answer.output == text_tokens("ab")


def test_min_tokens_sets_the_suppress_flag_until_enough_tokens_exist():
    sched = make_scheduler()
    seq = make_seq("hi", GREEDY.replace(min_tokens=2))
    sched.add(seq)
    admit_all(sched)
    flags = []
    for tok in text_tokens("abc"):
        plan, _ = step(sched, {seq.request_id: tok})
        flags.append(plan.chunks[0].suppress_eog)
    assert flags == [True, True, False]  # samples 1 and 2 may not end; the 3rd may
    no_min = make_seq("hi")
    sched.add(no_min)
    admit_all(sched)
    plan = sched.schedule()
    assert not [c for c in plan.chunks if c.request_id == no_min.request_id][0].suppress_eog


def test_utf8_character_split_across_tokens_is_emitted_whole():
    sched = make_scheduler()
    seq = make_seq("hi", GREEDY.replace(max_tokens=4))
    events, text = generate(sched, seq, byte_tokens("é".encode()) + byte_tokens("€".encode())[:2])
    assert [e.text for e in events] == ["", "é", "", "\ufffd"]  # an unfinished char at the very end
    assert text == seq.answer.text
    assert "\ufffd" not in text[:-1]


def test_every_event_for_a_finished_sequence_is_flagged_once():
    sched = make_scheduler(n_slots=2)
    a = make_seq("a", GREEDY.replace(max_tokens=2))
    b = make_seq("b", GREEDY.replace(max_tokens=5))
    sched.add(a)
    sched.add(b)
    admit_all(sched)
    finished = []
    for _ in range(10):
        plan, events = step(sched)
        finished += [e.seq.request_id for e in events if e.finished]
        if not plan:
            break
    assert finished == [a.request_id, b.request_id]
    assert len(a.answer.output) == 2 and len(b.answer.output) == 5


def test_forget_slot_drops_what_it_cached():
    sched = make_scheduler(n_slots=1)
    finish_one(sched, "abcdef")
    sched.forget_slot(0)
    again = make_seq("abcdefg")
    sched.add(again)
    (_, _, reuse), = admit_all(sched)
    assert reuse == 0


def test_empty_plan_when_nothing_runs():
    sched = make_scheduler()
    assert not sched.schedule()
    assert isinstance(sched.schedule(), StepPlan)


# -- what runs next: the plan's contract, deadlines, the smaller plan after "no KV room" --------

def test_each_chunk_that_samples_carries_its_requests_sampler_and_logprobs():
    sched = make_scheduler(n_slots=2, chunk_size=4)
    with_lp = make_seq("a long prompt", GREEDY.replace(logprobs=3))
    plain = make_seq("hi")
    with_lp.sampler, plain.sampler = object(), object()
    for s in (with_lp, plain):
        sched.add(s)
    admit_all(sched)
    seen = []
    for _ in range(6):
        plan, _ = step(sched)
        for c in plan.chunks:
            seq = with_lp if c.request_id == with_lp.request_id else plain
            if c.wants_logits:
                assert c.sampler is seq.sampler and c.logprobs == seq.params.logprobs
                seen.append(c.request_id)
            else:  # a prompt chunk short of the end samples nothing
                assert c.sampler is None and c.logprobs is None
    assert with_lp.request_id in seen and plain.request_id in seen


def test_expired_names_waiting_and_running_sequences_past_their_deadline_once():
    sched = make_scheduler(n_slots=1)
    running = make_seq("a", GREEDY.replace(timeout=5))
    waiting = make_seq("b", GREEDY.replace(timeout=1))
    untimed = make_seq("c")
    for s in (running, waiting, untimed):
        sched.add(s)
    admit_all(sched)
    t0 = running.clock.submitted_at
    assert sched.expired(t0) == []
    assert sched.expired(waiting.clock.deadline) == [waiting]
    sched.finish(waiting, "timeout")
    assert sched.expired(running.clock.deadline + 1) == [running]  # the finished one is not named again
    sched.finish(running, "timeout")
    assert sched.expired(t0 + 10**6) == []


def test_shrink_defers_prefill_first_then_halves_and_gives_up_on_one_chunk():
    sched = make_scheduler(n_slots=4, chunk_size=4)
    seqs = [make_seq(f"p{i}") for i in range(4)]
    for s in seqs:
        sched.add(s)
    admit_all(sched)
    for _ in range(3):
        step(sched)  # all four generating
    sched.add(make_seq("a new prompt"))
    plan = sched.schedule()
    assert plan.decode_tokens == 4 and plan.prefill_tokens == 0  # no idle slot for the newcomer
    only_decode = sched.shrink(plan)
    assert len(only_decode.chunks) == 2  # all decode already: halve
    assert len(sched.shrink(only_decode).chunks) == 1
    assert sched.shrink(sched.shrink(only_decode)) is None

    sched2 = make_scheduler(n_slots=2, chunk_size=4)
    a, b = make_seq("a"), make_seq("a longer prompt")
    sched2.add(a)
    admit_all(sched2)
    step(sched2)  # a generating
    sched2.add(b)
    admit_all(sched2)
    mixed = sched2.schedule()
    assert mixed.decode_tokens and mixed.prefill_tokens
    deferred = sched2.shrink(mixed)
    assert [c.request_id for c in deferred.chunks] == [a.request_id] and deferred.prefill_tokens == 0
