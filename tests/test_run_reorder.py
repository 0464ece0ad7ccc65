"""Prefix-aware ordering in `llamabatch run`: lines start grouped by shared prompt
prefix inside a bounded read-ahead window (start_order.py), while records keep --order,
every line is answered exactly once and --resume is unchanged. The choice itself is tested
pure; the run on the scripted fake runner, in-process (the engine's submit order recorded)."""
from __future__ import annotations

import io
import json
import os
import random
import signal
import threading
import time

from llamabatch import Engine, EngineConfig
from llamabatch.jobs.batch_loop import STREAM_LINGER_S, BatchLoop
from llamabatch.jobs.batch_watch import StopRequests, watch
from llamabatch.jobs.reading.input_source import Source
from llamabatch.jobs.writing.output_sink import open_output
from llamabatch.openai_format.lines import EmbedLine, LineParser, LineRequest
from llamabatch.core.prefixes.common_prefix import common_prefix
from llamabatch.jobs.reading.start_order import MIN_SHARED, StartOrder, prompt_key
from llamabatch.jobs.writing.record_writer import RecordWriter
from llamabatch.params import SamplingParams
from llamabatch.cli.run.job_view import Interrupts

from cli_harness import FakeEngines, invoke, runner_for
from fake_runner import FakeRunner, text_tokens

# Four instructions, long enough to be worth grouping (the fake: one token per character).
INSTRUCTIONS = [f"Instruction {name}: " + (name.lower() * 7 + " ") * 30 for name in "ABCD"]
N_LINES = 48


def interleaved(path, n: int = N_LINES, extra: dict[int, str] | None = None) -> list[str]:
    """n lines, instruction i % 4 on line i (ids 0..n-1); `extra` replaces some lines' text.
    Returns each line's instruction letter (or "" for a replaced line)."""
    letters, lines = [], []
    for i in range(n):
        if extra and i in extra:
            lines.append(extra[i])
            letters.append("")
            continue
        letters.append("ABCD"[i % 4])
        lines.append(json.dumps({"id": i, "prompt": INSTRUCTIONS[i % 4] + f"question {i}?"}))
    path.write_text("\n".join(lines) + "\n")
    return letters


class Recording(FakeEngines):
    """The fake engine factory, recording every prompt in the order the engine received it."""

    def __init__(self, **runner_kw):
        super().__init__(runner_for(reply=lambda p: "ok", **runner_kw), [])
        self.received: list = []

    def open(self, resolved, **kw):
        engine = super().open(resolved, **kw)
        submit = engine.submit

        def recording_submit(prompt, params=None, **kw):
            self.received.append(prompt)
            return submit(prompt, params, **kw)

        engine.submit = recording_submit
        return engine

    def received_ids(self) -> list[int]:
        return [int(p.rsplit("question ", 1)[1].rstrip("?")) for p in self.received]


def run(args, factory=None, **kw):
    factory = factory or Recording()
    result = invoke(["run", *map(str, args)], factory=factory, **kw)
    return result, factory


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def evaluated(recs: list[dict]) -> int:
    return sum(r["usage"]["prompt_tokens"] - r["usage"]["cached_tokens"] for r in recs)


def overtakes(start_order: list[int]) -> int:
    """The most lines read after a line (larger id) that started before it."""
    return max((sum(1 for j in start_order[:k] if j > i) for k, i in enumerate(start_order)), default=0)


def runs(labels: list[str]) -> int:
    return 1 + sum(1 for a, b in zip(labels, labels[1:]) if a != b)


# -- the choice, pure ---------------------------------------------------------------------------

def line(i: int, prompt) -> LineRequest:
    return LineRequest(i + 1, i, prompt, SamplingParams())


def order_of(order: StartOrder, prompts: list) -> list[int]:
    """Start every prompt through `order`, keeping it full while lines remain (as the reader does)."""
    started, queue = [], list(enumerate(prompts))
    while queue or len(order):
        while queue and not order.full:
            i, p = queue.pop(0)
            order.add(i, line(i, p))
        started.append(order.take()[0])
    return started


def test_window_1_and_0_start_in_read_order():
    prompts = [INSTRUCTIONS[i % 4] + str(i) for i in range(20)]
    for window in (0, 1):
        assert order_of(StartOrder(window, recent=1), prompts) == list(range(20))


def test_one_slot_starts_runs_of_one_instruction():
    prompts = [INSTRUCTIONS[i % 4] + f"question {i}" for i in range(N_LINES)]
    started = order_of(StartOrder(16, recent=1), prompts)
    assert sorted(started) == list(range(N_LINES))  # each once
    labels = ["ABCD"[i % 4] for i in started]
    assert runs(labels) <= 8  # read order: 48 runs of one line
    assert started[:5] == [0, 4, 8, 12, 16]  # the first instruction's lines in the window, in read order


def test_fewer_slots_than_instructions_keeps_to_the_instructions_the_slots_hold():
    prompts = [INSTRUCTIONS[i % 4] + f"question {i}" for i in range(N_LINES)]
    started = order_of(StartOrder(16, recent=2), prompts)
    labels = ["ABCD"[i % 4] for i in started]
    # the first two lines fill the two slots (A, B); A and B lines follow while the window has
    # any, in read order, before C's first line has been overtaken 16 times
    assert labels[:2] == ["A", "B"]
    assert set(labels[:16]) == {"A", "B"}
    assert started[:6] == [0, 1, 4, 5, 8, 9]


def test_as_many_slots_as_instructions_is_read_order():
    prompts = [INSTRUCTIONS[i % 4] + f"question {i}" for i in range(N_LINES)]
    assert order_of(StartOrder(16, recent=4), prompts) == list(range(N_LINES))


def test_a_line_is_never_overtaken_by_more_than_the_window():
    rng = random.Random(29)
    for _ in range(60):
        window, recent = rng.randint(1, 12), rng.randint(1, 4)
        # a few prefixes, some lines of a rare one, embeddings among them
        prompts = []
        for i in range(rng.randint(1, 80)):
            kind = rng.random()
            if kind < 0.1:
                prompts.append(None)  # an embeddings line
            else:
                prompts.append(INSTRUCTIONS[0 if kind < 0.8 else rng.randint(1, 3)] + str(i))
        order = StartOrder(window, recent=recent)
        started, queue = [], list(enumerate(prompts))
        while queue or len(order):
            # the reader does not always keep up: add 0..window lines before each start
            for _ in range(rng.randint(0, window)):
                if queue and not order.full:
                    i, p = queue.pop(0)
                    order.add(i, embed_line(i) if p is None else line(i, p))
            if len(order):
                started.append(order.take()[0])
        assert sorted(started) == list(range(len(prompts)))
        assert overtakes(started) <= window, (window, recent, started)


def embed_line(i: int) -> LineRequest:
    return LineRequest(i + 1, i, "to embed", SamplingParams(), embed=EmbedLine(inputs="to embed"))


def test_an_embeddings_line_starts_when_it_is_the_oldest():
    order = StartOrder(8, recent=1)
    prompts = [INSTRUCTIONS[0] + "0", None, INSTRUCTIONS[0] + "2", INSTRUCTIONS[1] + "3", INSTRUCTIONS[0] + "4"]
    for i, p in enumerate(prompts):
        order.add(i, embed_line(i) if p is None else line(i, p))
    assert [order.take()[0] for _ in range(5)] == [0, 1, 2, 4, 3]


def test_own_text_does_not_reorder_lines_of_one_instruction():
    # Line 2 shares more with line 0 ("question 1" vs "question 2..."), but less than
    # MIN_SHARED more: among lines of one instruction, read order stays.
    order = StartOrder(8, recent=1)
    for i, p in enumerate([INSTRUCTIONS[0] + "question 10", INSTRUCTIONS[0] + "question 2",
                           INSTRUCTIONS[0] + "question 11"]):
        order.add(i, line(i, p))
    assert [order.take()[0] for _ in range(3)] == [0, 1, 2]


def test_a_line_whose_shared_block_is_not_cached_waits_for_those_that_are():
    # Every line shares the system prompt; each task adds its own few-shot block. With task 1's
    # block in the slot, task 2's first line would evaluate its block now; task 1's next line
    # costs only its own text, so it goes first; then task 2's lines, the second one by fork.
    system = "You are a careful annotator. " * 4
    shots = {1: "Example: cat -> animal. " * 20, 2: "Example: red -> colour. " * 20}
    order = StartOrder(8, recent=1)
    for i, (task, q) in enumerate([(1, "q0"), (2, "q1"), (1, "q2"), (2, "q3")]):
        order.add(i, line(i, system + shots[task] + q))
    assert [order.take()[0] for _ in range(4)] == [0, 2, 1, 3]


def test_a_line_sharing_only_what_is_cached_is_not_held_back():
    system = "You are a careful annotator. " * 4  # cached after the first line
    shots = "Example: x -> y. " * 20
    order = StartOrder(8, recent=1)
    for i, p in enumerate([system + shots + "q0", system + "q1", system + shots + "q2"]):
        order.add(i, line(i, p))
    assert [order.take()[0] for _ in range(3)] == [0, 1, 2]


def test_what_a_line_shares_is_the_longest_prefix_it_shares_with_any_line_met():
    # StartOrder keeps it from sorted neighbours; checked against every pair, as lines come and go
    rng = random.Random(7)
    for _ in range(40):
        order = StartOrder(rng.randint(2, 10), recent=rng.randint(1, 3), min_shared=3)
        met: dict[int, set[int]] = {}  # seq -> the seqs it waited beside (and the started it saw)
        keys: dict[int, str] = {}
        started: list[int] = []
        for i in range(rng.randint(1, 40)):
            keys[i] = "".join(rng.choice("ab") for _ in range(rng.randint(0, 8)))
            if order.full:
                started.append(order.take()[0])
            waiting = {w.seq for w in order._waiting}
            met[i] = set(waiting) | set(started[-order._recent.maxlen:])
            for j in waiting:
                met[j].add(i)
            order.add(i, line(i, keys[i]))
            for w in order._waiting:
                if w.key is not None:
                    want = max((common_prefix(keys[w.seq], keys[j]) for j in met[w.seq]), default=0)
                    assert w.shared == want, (w.seq, keys, met[w.seq])


def test_prompt_keys():
    assert prompt_key(line(0, "hello")) == "hello"
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "T"}]}]
    assert prompt_key(line(0, chat)) == "\x1esystem\x1fS\x1euser\x1fT"
    assert prompt_key(line(0, [104, 105])) == "\x00hi"
    assert prompt_key(embed_line(0)) is None
    a = "x" * 1000 + "abc"
    assert common_prefix(a, "x" * 1000 + "abd") == 1002
    assert common_prefix(a, a) == len(a) and common_prefix(a, "") == 0 and common_prefix("b", a) == 0
    assert MIN_SHARED < len(INSTRUCTIONS[0])


def test_drain_gives_back_every_waiting_line_in_read_order():
    order = StartOrder(8, recent=1)
    for i in range(5):
        order.add(i, line(i, INSTRUCTIONS[i % 2] + str(i)))
    order.take()
    assert [seq for seq, _ in order.drain()] == [1, 2, 3, 4]
    assert len(order) == 0


# -- the run, on the fake runner -------------------------------------------------------------

FAST = ["--max-tokens", "2", "--no-isolate"]


def test_interleaved_instructions_start_grouped_and_records_stay_in_input_order(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    letters = interleaved(inp)
    result, engine = run([inp, "-o", out, "--n-parallel", "1", "--reorder-window", "16", *FAST])
    assert result.exit_code == 0, result.stderr
    started = engine.received_ids()
    assert sorted(started) == list(range(N_LINES))  # each line went to the engine once
    assert runs([letters[i] for i in started]) <= 8  # read order: 48
    assert overtakes(started) <= 16
    recs = records(out.read_text())
    assert [r["id"] for r in recs] == list(range(N_LINES))  # --order input holds
    assert all(r["error"] is None and r["text"] == "ok" for r in recs)


def test_grouping_evaluates_fewer_prompt_tokens_than_read_order(tmp_path):
    # Two slots, four instructions: in read order each slot is taken by another instruction
    # before its own comes back; grouped, the slots keep theirs.
    inp = tmp_path / "in.jsonl"
    interleaved(inp)
    costs = {}
    for window in ("1", "8"):
        out = tmp_path / f"out{window}.jsonl"
        result, _ = run([inp, "-o", out, "--n-parallel", "2", "--reorder-window", window, *FAST])
        assert result.exit_code == 0, result.stderr
        costs[window] = evaluated(records(out.read_text()))
    assert costs["8"] < 0.6 * costs["1"], costs


def test_window_1_starts_in_read_order(tmp_path):
    inp = tmp_path / "in.jsonl"
    interleaved(inp)
    result, engine = run([inp, "--n-parallel", "1", "--reorder-window", "1", *FAST])
    assert result.exit_code == 0, result.stderr
    assert engine.received_ids() == list(range(N_LINES))


def test_the_config_file_sets_the_window(tmp_path):
    inp, config = tmp_path / "in.jsonl", tmp_path / "config.toml"
    interleaved(inp)
    config.write_text("[run]\nreorder_window = 0\n")
    factory = Recording()
    result = invoke(["--config", str(config), "run", str(inp), "--n-parallel", "1", *FAST], factory=factory)
    assert result.exit_code == 0, result.stderr
    assert factory.received_ids() == list(range(N_LINES))
    # the flag beats the file
    factory = Recording()
    result = invoke(["--config", str(config), "run", str(inp), "--n-parallel", "1", "--reorder-window", "12",
                     *FAST], factory=factory)
    assert result.exit_code == 0, result.stderr
    assert factory.received_ids() != list(range(N_LINES))
    assert overtakes(factory.received_ids()) <= 12


def test_completion_order_writes_every_line_once(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    interleaved(inp)
    result, engine = run([inp, "-o", out, "--n-parallel", "2", "--order", "completion", *FAST])
    assert result.exit_code == 0, result.stderr
    assert sorted(r["id"] for r in records(out.read_text())) == list(range(N_LINES))
    assert overtakes(engine.received_ids()) <= 8  # default: 4 x 2 slots


def test_bad_lines_and_embeddings_keep_one_record_each(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    extra = {5: "{not json", 9: json.dumps({"id": 9, "input": "embed me"}), 13: json.dumps({"id": 3, "prompt": "x"}),
             20: json.dumps({"id": 20, "input": "embed me too"})}
    interleaved(inp, extra=extra)
    result, _ = run([inp, "-o", out, "--n-parallel", "1", "--reorder-window", "16", *FAST])
    assert result.exit_code == 0, result.stderr
    recs = records(out.read_text())
    assert len(recs) == N_LINES  # one record per line, in input order
    assert recs[5]["error"]["code"] == "invalid_json"
    assert recs[13]["id"] == 3 and recs[13]["error"]["code"] == "duplicate_id"
    assert recs[9]["id"] == 9 and recs[9]["embeddings"] and recs[20]["embeddings"]
    assert [r["id"] for i, r in enumerate(recs) if i not in (5, 13)] == [i for i in range(N_LINES) if i not in (5, 13)]


def test_resume_after_a_stop_answers_the_rest_exactly_once(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    interleaved(inp)
    stopped = []

    def ctrl_c(step, plan):  # Ctrl-C a few ticks in: the lines in flight finish, the read-ahead ones do not start
        # (once the run's own handler is in place: on a loaded machine its steps can come first)
        if step >= 6 and not stopped and isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None),
                                                     Interrupts):
            stopped.append(step)
            os.kill(os.getpid(), signal.SIGINT)

    first = Recording(hook=ctrl_c, step_delay=0.01)
    result, _ = run([inp, "-o", out, "--n-parallel", "1", "--reorder-window", "16", *FAST], factory=first)
    assert result.exit_code == 130, result.stderr
    done = records(out.read_text())
    assert 1 <= len(done) < N_LINES
    assert len({r["id"] for r in done}) == len(done)
    # every line started got its record; none read ahead but unstarted did
    assert sorted(r["id"] for r in done) == sorted(first.received_ids())

    second = Recording()
    result, _ = run([inp, "-o", out, "--n-parallel", "1", "--reorder-window", "16", "--resume", *FAST],
                    factory=second)
    assert result.exit_code == 0, result.stderr
    assert not set(second.received_ids()) & {r["id"] for r in done}  # nothing answered runs again
    everything = records(out.read_text())
    assert sorted(r["id"] for r in everything) == list(range(N_LINES))  # each line exactly once


def test_lines_from_a_slow_stream_start_without_waiting_for_the_window_to_fill(tmp_path):
    # A producer that writes two lines and then takes its time (a pipe into `run -`): they
    # start after STREAM_LINGER_S, not when 14 more lines (or EOF) come.
    engine = Engine(EngineConfig(n_parallel=4, n_batch=64, max_queue=0), runner=FakeRunner(n_slots=4, n_batch=64),
                    default_params=SamplingParams(temperature=0, max_tokens=2))
    r, w = os.pipe()
    out = tmp_path / "out.jsonl"
    sink = open_output(str(out), "-")
    sink.start_fresh()
    window = threading.Semaphore(64 + 16)
    writer = RecordWriter(sink, engine.model_name, "input", window)
    run = BatchLoop(engine, LineParser(engine.default_params, input_format="jsonl"),
                   Source("-", os.fdopen(r, "rb"), False), writer, window, max_inflight=16, reorder_window=16,
                   slots=4)
    try:
        run.start()
        os.write(w, b'{"id": 1, "prompt": "first"}\n{"id": 2, "prompt": "second"}\n')
        deadline = time.monotonic() + 10
        while writer.stats.written < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.stats.written == 2 and not run.finished  # answered while INPUT is still open
        os.write(w, b'{"id": 3, "prompt": "third"}\n')
        os.close(w)
        w = None
        while not run.finished and time.monotonic() < deadline:
            time.sleep(0.01)
        assert run.finished and run.read_error is None
    finally:
        if w is not None:
            os.close(w)
        writer.close()
        sink.close()
        engine.close()
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [1, 2, 3]
    assert STREAM_LINGER_S < 1


def test_a_full_writer_window_does_not_wait_for_the_start_order_to_fill(tmp_path):
    # The writer's window (admitted lines not yet written) smaller than the start order: the
    # reader stops before the start order is full, so the starter must not wait for it.
    engine = Engine(EngineConfig(n_parallel=2, n_batch=64, max_queue=0), runner=FakeRunner(n_slots=2, n_batch=64),
                    default_params=SamplingParams(temperature=0, max_tokens=2))
    data = "".join(json.dumps({"id": i, "prompt": INSTRUCTIONS[i % 4] + str(i)}) + "\n" for i in range(20))
    out = tmp_path / "out.jsonl"
    sink = open_output(str(out), "in")
    sink.start_fresh()
    window = threading.Semaphore(3)
    writer = RecordWriter(sink, engine.model_name, "input", window)
    source = Source("in", io.BytesIO(data.encode()), True)  # a regular file: no stream linger
    run = BatchLoop(engine, LineParser(engine.default_params, input_format="jsonl"), source, writer, window,
                   max_inflight=2, reorder_window=16, slots=2)
    done = threading.Event()
    try:
        run.start()
        waiter = threading.Thread(target=lambda: (watch(run, StopRequests(), lambda _event: None,
                                                        None), done.set()), daemon=True)
        waiter.start()
        assert done.wait(20), "the run waited forever"
    finally:
        run.stop_admitting()
        writer.close()
        sink.close()
        engine.close()
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == list(range(20))


# -- long lines start last (run with n_ctx auto: jobs/reading/context_fit.py) ---------------------------

def test_long_lines_start_after_every_other_line_read():
    prompts = [f"line {i}" for i in range(30)]
    long = {3, 17}
    order = StartOrder(8, recent=2, last=lambda item: item.id in long)
    started = order_of(order, prompts)
    assert sorted(started) == list(range(30))
    assert started[-2:] == [3, 17]  # oldest long line first, once only long lines wait
    assert [i for i in started if i not in long] == [i for i in range(30) if i not in long]


def test_a_window_full_of_long_lines_starts_them_rather_than_wait():
    long = set(range(10))
    order = StartOrder(4, recent=1, last=lambda item: item.id in long)
    started = order_of(order, [f"p{i}" for i in range(14)])
    assert started[:4] == [0, 1, 2, 3]  # nothing else could start: no deadlock, read order among them
    assert sorted(started) == list(range(14))


def run_with_long_lines(tmp_path, n: int, long: set[int], writer_window: int, reorder_window: int):
    """A BatchLoop over n lines whose ids in `long` start last; the runner's plans, and the records' ids."""
    runner = FakeRunner(n_slots=2, n_batch=64, reply=lambda p: "ab")
    engine = Engine(EngineConfig(n_parallel=2, n_batch=64, max_queue=0), runner=runner,
                    default_params=SamplingParams(temperature=0, max_tokens=2))
    data = "".join(json.dumps({"id": i, "prompt": "LONG" if i in long else f"q{i}"}) + "\n" for i in range(n))
    out = tmp_path / "out.jsonl"
    sink = open_output(str(out), "in")
    sink.start_fresh()
    window = threading.Semaphore(writer_window)
    writer = RecordWriter(sink, engine.model_name, "input", window)
    source = Source("in", io.BytesIO(data.encode()), True)
    run = BatchLoop(engine, LineParser(engine.default_params, input_format="jsonl"), source, writer, window,
                    max_inflight=4, reorder_window=reorder_window, slots=2, start_last=lambda item: item.id in long)
    done = threading.Event()
    try:
        run.start()
        threading.Thread(target=lambda: (watch(run, StopRequests(), lambda _event: None, None), done.set()),
                         daemon=True).start()
        assert done.wait(20), "the run waited forever"
    finally:
        run.stop_admitting()
        writer.close()
        sink.close()
        engine.close()
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    return runner, ids


def test_a_long_line_starts_once_the_other_lines_have_ended(tmp_path):
    runner, ids = run_with_long_lines(tmp_path, 12, {4}, writer_window=64, reorder_window=16)
    assert ids == list(range(12))  # input order kept, one record each
    long_id = next(c.request_id for p in runner.plans for c in p.plan.chunks if c.tokens == text_tokens("LONG"))
    first_long = next(i for i, p in enumerate(runner.plans) if any(c.request_id == long_id for c in p.plan.chunks))
    others = [i for i, p in enumerate(runner.plans) if any(c.request_id != long_id for c in p.plan.chunks)]
    assert max(others) < first_long  # no tick carried the long line beside another line
    assert runner.violations == []


def test_a_long_line_behind_a_full_writer_window_still_starts(tmp_path):
    # In input order the records after the long line wait for it: a writer window of 3 fills,
    # the reader stops, and the long line must start rather than wait forever.
    runner, ids = run_with_long_lines(tmp_path, 20, {2}, writer_window=3, reorder_window=16)
    assert ids == list(range(20))
