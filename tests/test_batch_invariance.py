"""Deterministic mode without a model: the batch shapes, the --verify sampler and comparison,
the refusal on GPU builds, and the flag's way through options and the config file."""
from __future__ import annotations

import io

import pytest

from cli_harness import invoke

from llamabatch.kernel_paths import batch_invariance as inv
from llamabatch.settings.layers import merge
from llamabatch.cli.run.progress import PlainReporter
from llamabatch.cli.run.job_summary import verified
from llamabatch.jobs.job_running import verify_sample
from llamabatch.config import EngineConfig
from llamabatch.settings.config_file import parse_text
from llamabatch.errors import DeterminismUnavailable
from llamabatch.params import SamplingParams
from llamabatch.core.plan import Chunk
from llamabatch.results import Result, Timings, Usage
from llamabatch.jobs.resume.verify import Reservoir, rerun_alone


def prefill(slot: int, n: int, start: int = 0, last: bool = True) -> Chunk:
    return Chunk(slot, 100 + slot, list(range(10, 10 + n)), start, wants_logits=last, is_decode=False)


def decode(slot: int, pos: int = 5) -> Chunk:
    return Chunk(slot, 100 + slot, [7], pos, wants_logits=True, is_decode=True)


def rows_per_seq(p: inv.Pass) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in p.rows:
        out[r.seq] = out.get(r.seq, 0) + 1
    return out


@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 9, 13, 16, 255, 256])
def test_prefill_chunk_padded_to_tile_inside_its_sequence(n):
    p = inv.prefill_pass([prefill(2, n, start=40)])
    size = len(p.rows)
    assert size % inv.TILE == 0 and size >= inv.MIN_ROWS and size - n < max(inv.TILE, inv.MIN_ROWS)
    assert [r.pos for r in p.rows] == list(range(40, 40 + size))  # consecutive: dummies after the chunk
    assert all(r.seq == 2 for r in p.rows)
    assert [r.token for r in p.rows[:n]] == list(range(10, 10 + n))
    # the final chunk asks logits for exactly MIN_ROWS rows, and samples its last real one
    assert sum(r.logits for r in p.rows) == inv.MIN_ROWS
    assert p.sample_rows == [(p.sample_rows[0][0], n - 1)] and p.rows[n - 1].logits
    assert p.trims == ([(2, 40 + n)] if size > n else [])


def test_middle_prefill_chunk_asks_no_logits():
    p = inv.prefill_pass([prefill(0, 5, last=False), prefill(1, 12)])
    assert rows_per_seq(p) == {0: 8, 1: 12}
    assert [r.logits for r in p.rows[:8]] == [False] * 8
    assert sum(r.logits for r in p.rows[8:]) == inv.MIN_ROWS
    assert [(c.slot, row) for c, row in p.sample_rows] == [(1, 8 + 11)]


def split_equal(rows: list[inv.Row]) -> list[list[inv.Row]]:
    """How llama.cpp (src/llama-batch.cpp, split_equal(sequential=true), one KV stream per
    sequence) cuts one llama_decode call into ubatches: a run of consecutive sequence ids,
    starting at the first unused row's, and the SAME number of rows taken from each."""
    used = [False] * len(rows)
    out = []
    while not all(used):
        seqs: list[int] = []
        for i, r in enumerate(rows):
            if not used[i] and r.seq not in seqs and (not seqs or r.seq == seqs[-1] + 1):
                seqs.append(r.seq)
        left = {s: [i for i, r in enumerate(rows) if r.seq == s and not used[i]] for s in seqs}
        take = min(len(v) for v in left.values())
        idx = [i for s in seqs for i in left[s][:take]]
        for i in idx:
            used[i] = True
        out.append([rows[i] for i in idx])
    return out


def test_chunks_of_different_lengths_in_one_call_would_be_cut_below_min_rows():
    # the defect prefill_passes avoids: 8 rows of slot 1 next to 12 of slot 2 run as a
    # 16-row ubatch and a 4-row one holding the end of slot 2's chunk
    cuts = split_equal(inv.prefill_pass([prefill(1, 5), prefill(2, 12)]).rows)
    assert [len(u) for u in cuts] == [16, 4]


@pytest.mark.parametrize("mix", [[(0, 3), (1, 17), (2, 8), (3, 30)], [(1, 5), (2, 12)],
                                 [(5, 1), (2, 9), (3, 12), (4, 4), (0, 256), (6, 11)]])
def test_every_prefill_chunk_runs_whole_in_a_ubatch_of_at_least_min_rows(mix):
    passes = inv.prefill_passes([prefill(s, n, last=s % 2 == 0) for s, n in mix])
    assert sorted(c.slot for p in passes for c in p.chunks) == sorted(s for s, _ in mix)
    for p in passes:
        assert len({inv.padded_len(len(c.tokens)) for c in p.chunks}) == 1  # one length per call
        for ubatch in split_equal(p.rows):
            assert len(ubatch) % inv.TILE == 0 and len(ubatch) >= inv.MIN_ROWS
            n_logits = sum(r.logits for r in ubatch)
            assert n_logits == 0 or (n_logits % inv.TILE == 0 and n_logits >= inv.MIN_ROWS)
            for seq in {r.seq for r in ubatch}:  # each sequence's chunk whole in this ubatch
                assert sum(r.seq == seq for r in ubatch) == sum(r.seq == seq for r in p.rows)


def test_decode_pass_fills_gaps_and_pads_to_a_tile_of_at_least_min_rows():
    ends = {i: 20 + i for i in range(12)}
    p = inv.decode_pass([decode(2, 9), decode(5, 11)], 12, ends.__getitem__)
    # ids 2..5 filled, extended to 8; each id 2 rows (attention's multi-row path), its
    # token first, a padding row after it in its own stream
    assert [r.seq for r in p.rows] == [s for s in range(2, 10) for _ in range(2)]
    assert all(r.logits for r in p.rows)
    assert [(c.slot, row) for c, row in p.sample_rows] == [(2, 0), (5, 6)]
    assert [(r.token, r.pos) for r in p.rows[:2]] == [(7, 9), (inv.PAD_TOKEN, 10)]
    assert [r.pos for r in p.rows if r.seq == 3] == [23, 24]
    assert dict(p.trims) == {**{s: ends[s] for s in (3, 4, 6, 7, 8, 9)}, 2: 10, 5: 12}


def test_a_decode_pass_with_guesses_gives_every_id_the_longest_chunks_rows():
    guessing = Chunk(1, 101, [7, 8, 9, 10], 30, wants_logits=True, is_decode=True, n_draft=3)
    p = inv.decode_pass([decode(0, 5), guessing], 8, lambda s: 0)
    assert len(p.rows) == 8 * 4 and all(sum(r.seq == s for r in p.rows) == 4 for s in range(8))
    assert [(r.token, r.pos) for r in p.rows if r.seq == 1] == [(7, 30), (8, 31), (9, 32), (10, 33)]
    assert [r.token for r in p.rows if r.seq == 0] == [7] + [inv.PAD_TOKEN] * 3
    # the verified chunk's sample row is its last guess's (llama/sampling/chunk_sampling.py ChunkSampler.verify reads back)
    assert dict((c.slot, row) for c, row in p.sample_rows) == {0: 0, 1: 7}
    assert dict(p.trims)[0] == 6 and dict(p.trims)[1] == 34
    too_long = Chunk(1, 101, list(range(inv.max_decode_rows() + 1)), 30, True, True, n_draft=inv.max_decode_rows())
    with pytest.raises(ValueError):
        inv.decode_pass([too_long], 8, lambda s: 0)


def test_decode_pass_extends_downwards_at_the_top_of_the_ids():
    p = inv.decode_pass([decode(7)], 8, lambda s: 0)
    assert sorted({r.seq for r in p.rows}) == list(range(0, 8))


@pytest.mark.parametrize("n_slots", [1, 2, 3, 4, 5, 7, 8, 9, 16])
def test_enough_sequence_ids_for_any_decode_pass(n_slots):
    n_ids = inv.n_sequence_ids(n_slots)
    assert n_ids >= n_slots
    p = inv.decode_pass([decode(s) for s in range(n_slots)], n_ids, lambda s: 0)
    assert len(p.rows) % inv.TILE == 0 and len(p.rows) >= inv.MIN_ROWS
    ids = {r.seq for r in p.rows}
    assert all(sum(r.seq == s for r in p.rows) == 2 for s in ids)  # equal rows per id: one ubatch


def ok(tokens: list[int], seed: int = 5) -> Result:
    return Result(0, "x", tokens, "stop", Usage(), Timings(), seed=seed)


def test_reservoir_keeps_n_finished_lines_with_their_seed():
    r = Reservoir(3)
    params = SamplingParams(temperature=0.7)
    for i in range(20):
        r.offer(i, f"p{i}", params, ok([i], seed=1000 + i))
    r.offer("bad", "p", params, Result(0, "", [], "error", Usage(), Timings(), error="boom"))
    assert r.seen == 20 and len(r.samples) == 3
    assert all(s.params.seed == 1000 + s.key and s.token_ids == [s.key] for s in r.samples)


class PlantedDifference:
    """A test double for the engine: answers every re-run with the tokens it is given, except
    for one prompt, whose re-run differs at token 2."""

    def __init__(self, answers: dict[str, list[int]], differ: str | None):
        self.answers, self.differ, self.seen = answers, differ, []

    def submit(self, prompt, params, stream=False):
        self.seen.append((prompt, params.seed))
        tokens = list(self.answers[prompt])
        if prompt == self.differ:
            tokens[2] += 1

        class Handle:
            def result(self_inner):
                return ok(tokens)
        return Handle()


def test_rerun_alone_catches_a_planted_difference():
    answers = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9, 9, 9]}
    r = Reservoir(8)
    for key, tokens in answers.items():
        r.offer(key, key, SamplingParams(), ok(tokens, seed=42))
    assert rerun_alone(PlantedDifference(answers, None), r.samples) == []
    engine = PlantedDifference(answers, "b")
    diffs = rerun_alone(engine, r.samples)
    assert [(d.key, d.why) for d in diffs] == [("b", "first difference at token 2 (4 tokens in the run, 4 alone)")]
    assert {seed for _, seed in engine.seen} == {42}  # re-run with the seed the run used


def test_verify_report_lists_the_ids_that_differ_and_fails():
    answers = {"a": [1, 2, 3], "b": [4, 5, 6]}
    r = Reservoir(8)
    for key, tokens in answers.items():
        r.offer(key, key, SamplingParams(), ok(tokens))
    out = io.StringIO()
    assert verified(verify_sample(PlantedDifference(answers, "a"), r, deterministic=True), PlainReporter(out)) is False
    assert "verify: 1 of 2 differ: 'a'" in out.getvalue()
    out = io.StringIO()
    assert verified(verify_sample(PlantedDifference(answers, None), r, deterministic=True), PlainReporter(out)) is True
    assert "verified 2/2 identical" in out.getvalue()


def test_gpu_build_refuses_in_one_line_with_exit_2(monkeypatch, tmp_path):
    import llamabatch.llama.runner as runner

    monkeypatch.setattr(runner, "gpu_offload_supported", lambda: True)
    with pytest.raises(DeterminismUnavailable):
        runner.LlamaRunner(EngineConfig(deterministic=True), "never-loaded.gguf")
    prompts = tmp_path / "in.txt"
    prompts.write_text("hello\n")
    # in-process (--no-isolate): the monkeypatch does not reach a supervised child; there the
    # child's DeterminismUnavailable comes back to the parent by name and ends the same way
    result = invoke(["run", str(prompts), "--deterministic", "--no-isolate"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--deterministic needs a CPU-only llama.cpp build" in lines[0]


def test_flag_env_and_config_file_reach_engine_config(monkeypatch):
    monkeypatch.delenv("LLAMABATCH_DETERMINISTIC", raising=False)
    assert merge({}, "run").engine.deterministic is False
    assert merge({"deterministic": True}, "run").engine.deterministic is True
    monkeypatch.setenv("LLAMABATCH_DETERMINISTIC", "1")
    assert merge({}, "run").engine.deterministic is True
    monkeypatch.delenv("LLAMABATCH_DETERMINISTIC")
    config = parse_text("deterministic = true\n[bench]\ndeterministic = false\n", "llamabatch.toml")
    assert merge({}, "run", config.values_for("run")).engine.deterministic is True
    assert merge({}, "bench", config.values_for("bench")).engine.deterministic is False


def test_records_say_deterministic_only_when_on():
    assert "deterministic" not in ok([1]).to_dict()
    r = ok([1])
    r.deterministic = True
    assert r.to_dict()["deterministic"] is True


def test_deterministic_refuses_a_unified_kv_cache():
    # the invariance rests on one KV stream per sequence
    with pytest.raises(Exception, match="kv_unified must be false when deterministic is on"):
        EngineConfig(deterministic=True, kv_unified=True).validate()
    EngineConfig(deterministic=True).validate()


def test_deterministic_turns_cross_slot_prefix_sharing_off_and_keeps_n_forks():
    from llamabatch import Engine
    from fake_runner import FakeRunner

    with Engine(EngineConfig(deterministic=True), runner=FakeRunner(n_slots=4)) as e:
        assert e.scheduler.fork_min_tokens == 0 and not e.scheduler.cache_generated
        # n samples still fork sample 0's prompt KV (FakeRunner checks every fork it applies)
        r = e.generate(["hello"], SamplingParams(n=2, max_tokens=3, temperature=0.8, seed=5))[0]
        assert r.ok and len(r.samples) == 2
    with Engine(EngineConfig(), runner=FakeRunner(n_slots=4)) as e:
        assert e.scheduler.fork_min_tokens == EngineConfig().share_prefix_min
