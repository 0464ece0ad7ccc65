"""Speculative decoding on both model families and every CPU weight layout this machine runs:
greedy answers are the same tokens with --speculative auto as with off (with a prediction, by
prompt lookup, with a KV stream per slot and with the unified cache, for n samples), a chain
that draws at random but can only give one token gives that token, the verified rows'
logprobs are the plain rows' up to the kernels' batch effects, and guesses were verified and
kept (the comparisons compare something), and in deterministic mode the answers and their
logprobs are bit-identical to off's (verification rows padded by the batch-invariance rule). Sizes are small for the suite's time budget.

llama.cpp's CPU kernels are not batch-invariant: a row's logits move by a few hundredths
when the rows beside it change, with or without guesses (Gemma alone and beside 7 others with
--speculative off: logprobs up to 0.056 apart; SmolLM2's 'fix the spelling' lines: a first
token, sampled before any guess was verified, moved by 0.13 when the tick's other rows
changed). So an answer may part from off's at a near-tie, and only there: the tests check
that the first difference, if any, is to one of off's likeliest tokens within NEAR_TIE nats of off's
own pick (three may lie that close: Gemma once took off's third, 0.18 below its first)."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

from fixed_cost import FixedCost

pytestmark = pytest.mark.model

PARAGRAPH = ("The comittee met on tuesday to discus the new libary budget. Most members agred that the "
             "reading room needs new chairs, but the tresurer warned that the roof must be fixed first.")
QUOTE = ("Extract the sentence about the roof, word for word.\n\n" + PARAGRAPH + "\n\nThe sentence: ")
LISTING = "Repeat this list exactly: apples, pears, plums, cherries, lemons, limes, figs, dates.\nList: "
TOKENS = 40
NEAR_TIE = 0.3  # nats below off's pick where the kernels' batch effects may put another token first
TOP = 5  # off's likeliest tokens the logprobs carry, to find the one taken at a near-tie


def guessing(engine: Engine) -> Engine:
    """The engine with a fixed tick cost under which guesses pay: how many guesses it places
    follows the tick times it measures (on a loaded two-core machine 4 slots placed none), and
    these tests check what verified guesses give."""
    if engine.scheduler.speculation is not None:
        engine.scheduler.speculation.cost = FixedCost(run_ms=50.0, row_ms=0.5, logit_ms=0.5)
    return engine


def requests(family) -> list[tuple[object, SamplingParams]]:
    greedy = SamplingParams(max_tokens=TOKENS, temperature=0, logprobs=TOP)
    edit = f"Fix the spelling in this paragraph:\n\n{PARAGRAPH}\n\nFixed paragraph:\n"
    prompt = [{"role": "user", "content": edit}] if family.name == "smollm2" else edit
    return [(prompt, greedy.replace(prediction=PARAGRAPH)), (QUOTE, greedy), (LISTING, greedy),
            ("Once upon a time", greedy)]


def answers(family, cpu_path, speculative: str, **config):
    """The requests together, four slots, a KV stream per slot."""
    with Engine(EngineConfig(model=family.path, n_parallel=4, n_ctx=4 * 512, cpu_buffers=cpu_path,
                             speculative=speculative, **config)) as engine:
        guessing(engine)
        prompts, params = zip(*requests(family))
        results = engine.generate(list(prompts), list(params))
        stats = engine.stats()
    assert all(r.ok for r in results), [r.error for r in results]
    return results, stats


def same_tokens(family, on, off) -> None:
    """The same tokens, or the same up to a first difference at a near-tie of off's."""
    if on.token_ids == off.token_ids:
        assert on.finish_reason == off.finish_reason
        return
    n = min(len(on.token_ids), len(off.token_ids))
    i = next((i for i, (a, b) in enumerate(zip(on.token_ids, off.token_ids)) if a != b), n)
    if i == n:
        # one stopped where the other went on: an end-of-generation token at a near-tie with
        # the longer one's pick, read from the longer one's likeliest tokens at that point
        longer = on if len(on.token_ids) > n else off
        near = sorted((t["logprob"] for t in longer.logprobs[i]["top_logprobs"]), reverse=True)
        assert len(near) > 1 and near[0] - near[1] < NEAR_TIE, f"token {i}: one stopped with no near-tie"
        return
    top = {t["id"]: t["logprob"] for t in off.logprobs[i]["top_logprobs"]}
    assert on.token_ids[i] in top, f"token {i}: not one of off's {TOP} likeliest"
    gap = max(top.values()) - top[on.token_ids[i]]
    assert gap < NEAR_TIE, f"token {i} parts from off's {gap:.3f} nats below off's pick: no near-tie"


@pytest.fixture(scope="module")
def off(family, cpu_path):
    return answers(family, cpu_path, "off")[0]


def test_greedy_answers_are_the_same_tokens_with_guesses(family, cpu_path, off):
    on, stats = answers(family, cpu_path, "auto")
    for a, b in zip(on, off):
        same_tokens(family, a, b)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0  # guesses placed (guessing)
    assert stats.accepted_tokens == sum(r.usage.accepted_prediction_tokens for r in on)


def test_greedy_answers_with_the_unified_cache(family, cpu_path):
    # One cache for every slot: a row's attention runs over the cells in the order they lie, and
    # turned-down guesses free cells that other slots then fill, so beside other slots a greedy
    # answer may differ at a near-tie, as it may with other neighbours (docs/speculative.md).
    # One slot at a time, the cells lie in order either way: the same tokens.
    runs = {}
    for mode in ("auto", "off"):
        with Engine(EngineConfig(model=family.path, n_parallel=1, n_ctx=1024, cpu_buffers=cpu_path,
                                 kv_unified=True, speculative=mode)) as engine:
            guessing(engine)
            runs[mode] = [engine.generate([p], [q])[0] for p, q in requests(family)]
            stats = engine.stats()
        if mode == "auto":
            assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    for a, b in zip(runs["auto"], runs["off"]):
        same_tokens(family, a, b)


def test_a_random_chain_with_one_candidate_gives_the_greedy_tokens(family, cpu_path, off):
    # top_k=1 leaves one candidate: each verified row is drawn by the request's own chain (its
    # RNG stepping as without guesses) and a guess is kept when the draw equals it, so the
    # answer must be exactly the greedy one
    one = SamplingParams(max_tokens=TOKENS, temperature=0.7, top_k=1, seed=5, logprobs=TOP)
    with Engine(EngineConfig(model=family.path, n_parallel=2, n_ctx=1024, cpu_buffers=cpu_path)) as engine:
        guessing(engine)
        results = engine.generate([QUOTE, LISTING], [one.replace(prediction=off[1].text),
                                                     one.replace(prediction=off[2].text)])
    same_tokens(family, results[0], off[1])
    same_tokens(family, results[1], off[2])
    assert sum(r.usage.accepted_prediction_tokens for r in results) > 0


def test_verified_rows_report_the_plain_rows_logprobs(family, cpu_path, off):
    # the prediction is the answer itself (off's), so every guess is verified and kept
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=TOP)
    runs = {}
    for mode in ("auto", "off"):
        with Engine(EngineConfig(model=family.path, n_parallel=1, n_ctx=1024, cpu_buffers=cpu_path,
                                 speculative=mode)) as engine:
            guessing(engine)
            runs[mode] = engine.generate([QUOTE], [params.replace(prediction=off[1].text)])[0]
    on, plain = runs["auto"], runs["off"]
    same_tokens(family, on, plain)
    assert on.usage.accepted_prediction_tokens > 0 and len(on.logprobs) == len(on.token_ids)
    for a, b in zip(on.logprobs, plain.logprobs):
        if a["id"] != b["id"]:
            break  # parted at a near-tie (same_tokens checked it)
        assert abs(a["logprob"] - b["logprob"]) < 0.2  # the kernels' batch effects, not another row


def test_n_samples_and_sampled_requests_keep_working(family, cpu_path, off):
    greedy_pair = SamplingParams(max_tokens=TOKENS, temperature=0, n=2, logprobs=TOP)
    sampled = SamplingParams(max_tokens=TOKENS, temperature=0.8, seed=11)
    with Engine(EngineConfig(model=family.path, n_parallel=4, n_ctx=2048, cpu_buffers=cpu_path)) as engine:
        guessing(engine)
        pair, free = engine.generate([LISTING, QUOTE], [greedy_pair, sampled])
        assert engine.stats().drafted_tokens > 0
    for sample in pair.samples:
        same_tokens(family, sample, off[2])
    assert free.ok and free.usage.completion_tokens > 0


def test_deterministic_mode_gives_the_same_bits_with_guesses(family, cpu_path):
    # --deterministic pads every decode token with rows after it in its stream, so a token
    # verified beside guesses and one decoded without them take the same kernels: the same
    # tokens and the same logprobs, to the bit, greedy and seeded sampling alike
    greedy = SamplingParams(max_tokens=16, temperature=0, logprobs=TOP)
    sampled = greedy.replace(temperature=0.9, seed=21)
    listed = LISTING.split(": ", 1)[1]
    prompts = [LISTING, LISTING, QUOTE]
    params = [greedy.replace(prediction=listed), sampled.replace(prediction=listed), greedy]
    runs = {}
    for mode in ("auto", "off"):
        with Engine(EngineConfig(model=family.path, n_parallel=2, n_ctx=1024, cpu_buffers=cpu_path,
                                 deterministic=True, speculative=mode)) as engine:
            runs[mode] = engine.generate(prompts, params)
            stats = engine.stats()
        if mode == "auto":
            assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    for on, off in zip(runs["auto"], runs["off"]):
        assert on.ok and off.ok, (on.error, off.error)
        assert on.token_ids == off.token_ids and on.finish_reason == off.finish_reason
        assert [(a["id"], a["logprob"], a["top_logprobs"]) for a in on.logprobs] == \
               [(b["id"], b["logprob"], b["top_logprobs"]) for b in off.logprobs]
