"""Where guesses come from (core/drafts.py) and how many a tick places (core/speculation.py):
plain lists, no engine."""
from __future__ import annotations

from llamabatch.core.drafts import Drafter
from llamabatch.core.speculation import Candidate, TickCost, choose, expected
from llamabatch.kernel_paths.ubatch_split import ubatch_sizes

from fake_runner import text_tokens


def t(text: str) -> list[int]:
    return text_tokens(text)


def test_a_prediction_is_followed_and_found_again_after_an_edit():
    d = Drafter(t("fix it"), t("teh cat sat on the mat"))
    assert d.propose(4) == t("teh ")
    d.extend(t("th"))  # the answer departs: "th" instead of "te"
    d.extend(t("e"))
    d.extend(t(" c"))  # ... and comes back: " c" is found again right after "teh"
    assert d.propose(6) == t("at sat")


def test_a_prediction_that_cannot_be_found_again_falls_back_to_prompt_lookup():
    d = Drafter(t("quote: hello world"), t("abc"))
    d.extend(t("xyz hello"))
    assert d.propose(3) == t(" wo")


def test_prompt_lookup_takes_the_latest_earlier_occurrence_of_the_longest_suffix():
    d = Drafter(t("one two. two three. one two four"))
    d.extend(t(" one two"))
    assert d.propose(4) == t(" fou")
    assert Drafter(t("abcdef")).propose(3) == []  # the answer's suffix occurs nowhere earlier


def test_the_acceptance_rate_follows_verifications():
    d = Drafter(t("x"), t("xyz"))
    start = d.rate
    d.observe(8, 8)
    assert d.rate > start
    for _ in range(10):
        d.observe(4, 0)
    assert d.rate < 0.05
    assert (d.drafted, d.accepted) == (48, 8)


def test_expected_kept_guesses():
    assert expected(0.5, 2) == 0.5 + 0.25
    assert expected(1.0, 5) == 5 and expected(0.0, 5) == 0


def runs_streams(runs):
    return len(ubatch_sizes(runs, 512, unified=False))


def runs_unified(runs):
    return len(ubatch_sizes(runs, 512, unified=True))


def test_likely_guesses_are_placed_and_unlikely_ones_are_not():
    cost = TickCost(run_ms=20.0, row_ms=0.5, logit_ms=0.5)
    likely = [Candidate(0, 1, list(range(10)), 0.95)]
    assert choose(likely, [], 500, cost, runs_streams) == {0: 10}
    unlikely = [Candidate(0, 1, [5], 0.01)]
    assert choose(unlikely, [], 500, cost, runs_streams) == {}


def test_guesses_never_take_more_than_the_spare_rows():
    cost = TickCost(run_ms=20.0, row_ms=0.05, logit_ms=0.05)
    cands = [Candidate(s, 1, list(range(16)), 0.9) for s in range(4)]
    lengths = choose(cands, [], 10, cost, runs_unified)
    assert 0 < sum(lengths.values()) <= 10


def test_with_a_stream_per_slot_every_decode_slot_gets_the_same_rows():
    # one slot with good guesses among four decode slots: unequal rows would make a second graph
    # run, so the others get filler rows, or nobody guesses
    cost = TickCost(run_ms=20.0, row_ms=0.25, logit_ms=0.25)
    cands = [Candidate(0, 1, list(range(8)), 0.95)] + [Candidate(s, 1, [], 0.5) for s in (1, 2, 3)]
    lengths = choose(cands, [], 500, cost, runs_streams)
    assert len(set(lengths.values())) <= 1 and (not lengths or len(lengths) == 4)
    # with one cache for all slots the one slot guesses alone
    assert choose(cands, [], 500, cost, runs_unified) == {0: 8}


def test_a_tick_that_prefills_a_prompt_takes_no_guess_but_a_free_one():
    # the tick happens for the prompt's sake: a kept guess would save a row, not a tick
    cost = TickCost(run_ms=20.0, row_ms=0.5, logit_ms=0.5)
    likely = [Candidate(0, 1, list(range(10)), 0.95)]
    assert choose(likely, [(1, 64)], 500, cost, runs_streams, prefilling=True) == {}
    assert choose(likely, [(1, 64)], 500, cost, runs_streams, free=1, prefilling=True) == {0: 1}
    assert choose(likely, [(1, 64)], 500, cost, runs_streams)  # beside decode rows alone the guesses pay
