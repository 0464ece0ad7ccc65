"""`llamabatch run`: its behaviour in-process on the scripted fake runner (no model), and
end to end in real subprocesses on the bundled model (marked `model`) where a real process
matters: kill -9 and --resume, Ctrl-C, and every line shape on the real model.

Small slots (--n-ctx 1024 over 4 slots: 256 tokens each) and a few tokens per line keep
every real run to a few seconds on 2 cores.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_harness import invoke, runner_for

FAST = ["--n-parallel", "4", "--n-ctx", "1024", "--max-tokens", "4", "--temperature", "0"]
MODEL_NAME = "gemma-3-270m-q4_k_m"
FAKE_MODEL_NAME = "fake-model"  # tests/fake_runner.py's model_path
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture
def bundled_model(model_path, monkeypatch):
    # Resolve (and assemble, once) the bundled model before timing-sensitive subprocesses start.
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)


def llamabatch_run(*args: str, stdin: str | None = None, real_engine: bool = False,
                   **runner_kw) -> subprocess.CompletedProcess:
    """`llamabatch run ARGS` in-process: on the fake runner (FakeRunner keywords in
    `runner_kw`), or with `real_engine` the command's own engine factory (for model paths
    that must fail before anything loads)."""
    result = invoke(["run", *args], input=stdin or "", runner=None if real_engine else runner_for(**runner_kw))
    return subprocess.CompletedProcess(["llamabatch", "run", *args], result.exit_code, result.stdout, result.stderr)


def bundled_env() -> dict[str, str]:
    """The environment with the bundled Gemma named: without a model named, run takes the
    chat-tuned default when it is installed (models/default_model.py); these tests were written
    for, and name, the bundled one."""
    return {**os.environ, "LLAMABATCH_MODEL": "gemma"}


def real_run(*args: str, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`llamabatch run ARGS` as a real process on the bundled model."""
    return subprocess.run([sys.executable, "-m", "llamabatch", "run", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=bundled_env())


def start_run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llamabatch", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=bundled_env())



def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read_records(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "the last record must be whole"
    return [json.loads(line) for line in text.splitlines()]


def parse_records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def the_id(record: dict):
    return record["custom_id"] if "response" in record else record["id"]


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = path.read_bytes().count(b"\n") if path.exists() else 0
        if count >= n:
            return count
        assert proc.poll() is None, f"run ended early: {proc.communicate()[1]}"
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} records after {timeout}s")


def openai_line(custom_id: str, url: str = CHAT, **body) -> dict:
    body.setdefault("model", "gpt-4o-mini")
    if url == CHAT:
        body.setdefault("messages", [{"role": "user", "content": "Say hello"}])
    else:
        body.setdefault("prompt", "1, 2, 3,")
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def slow_lines(n: int, max_tokens: int = 24) -> list[dict]:
    # ignore_eos: every line takes exactly max_tokens, so a run lasts long enough to interrupt
    return [{"id": f"q{i}", "prompt": f"Count from {i}:", "max_tokens": max_tokens, "ignore_eos": True}
            for i in range(n)]


# -- shapes and per-line errors ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["fake", pytest.param("model", marks=pytest.mark.model)])
def test_every_shape_and_every_bad_line_gets_its_own_record(tmp_path, request, engine):
    if engine == "model":
        request.getfixturevalue("bundled_model")
    run, model_name = (real_run, MODEL_NAME) if engine == "model" else (llamabatch_run, FAKE_MODEL_NAME)
    long_prompt = "word " * 400  # > 256 tokens (and characters): longer than a slot
    lines = [
        "a plain text line",  # 1: in a .jsonl file a line that is not JSON is damage, not a prompt
        {"prompt": "The capital of France is", "id": "p1", "max_tokens": 3},  # 2
        {"messages": [{"role": "user", "content": "Hi"}], "id": "m1"},  # 3
        openai_line("chat-1", max_tokens=3),  # 4
        openai_line("comp-1", COMPLETIONS, max_completion_tokens=2),  # 5
        '{"prompt": "unterminated',  # 6 malformed JSON
        {"foo": 1},  # 7 unknown shape
        {**openai_line("emb-1"), "url": "/v1/moderations"},  # 8 unknown url
        {"prompt": "x", "max_tokens": "ten"},  # 9 wrong type
        {"prompt": "x", "top_p": 7},  # 10 out of range
        {"prompt": ""},  # 11 empty prompt
        {"prompt": long_prompt, "id": "long"},  # 12 over-long prompt
        openai_line("long-chat", messages=[{"role": "user", "content": long_prompt}]),  # 13 over-long, OpenAI
        {"prompt": "dup", "id": "p1"},  # 14 duplicate id
        "",  # 15 blank: skipped, no record
        "last line",  # 16
    ]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = run(str(inp), "-o", str(out), *FAST, "--fail-on-error")
    assert proc.returncode == 1, proc.stderr  # --fail-on-error: lines failed, yet every line was answered
    records = read_records(out)
    # lines that are no JSON have no id (null); a line that states no id has its line number
    assert [the_id(r) for r in records] == [None, "p1", "m1", "chat-1", "comp-1", None, 7, "emb-1", 9, 10, 11, "long",
                                            "long-chat", "p1", None]
    by_line = dict(zip([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16], records))

    for n in (2, 3):  # plain shape
        rec = by_line[n]
        assert list(rec) == ["id", "text", "finish_reason", "usage", "timings", "seed", "error"]
        assert rec["error"] is None and rec["finish_reason"] in ("stop", "length") and rec["usage"]["prompt_tokens"] > 0
    assert by_line[2]["usage"]["completion_tokens"] <= 3

    chat = by_line[4]  # OpenAI shape, with the loaded model's name
    assert chat["id"].startswith("batch_req_") and chat["error"] is None
    assert chat["response"]["status_code"] == 200
    body = chat["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == model_name
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 3 and "cached_tokens" in body["usage"]["prompt_tokens_details"]
    comp = by_line[5]["response"]["body"]
    assert comp["object"] == "text_completion" and comp["usage"]["completion_tokens"] <= 2

    def plain_error(n):
        rec = by_line[n]
        assert rec["finish_reason"] == "error" and rec["text"] == ""
        return rec["error"]["code"], rec["error"]["message"]

    def openai_error(n):
        rec = by_line[n]
        assert rec["response"]["status_code"] == 400 and rec["response"]["body"] is None
        return rec["error"]["code"], rec["error"]["message"]

    assert plain_error(1)[0] == plain_error(6)[0] == plain_error(16)[0] == "invalid_json"
    assert plain_error(7)[0] == "unknown_shape"
    assert openai_error(8)[0] == "invalid_url"
    assert plain_error(9) == ("invalid_request", "max_tokens must be an integer, got 'ten'")
    assert plain_error(10)[0] == "invalid_request" and "top_p" in plain_error(10)[1]
    assert plain_error(11) == ("invalid_request", "prompt is empty")
    assert plain_error(12)[0] == "context_overflow"
    assert openai_error(13)[0] == "context_overflow"
    assert plain_error(14)[0] == "duplicate_id"
    assert "line 6 failed: invalid_json: line 6 is not valid JSON" in proc.stderr
    assert "line 9 (id 9) failed: invalid_request" in proc.stderr
    assert re.search(r"15 line\(s\) in \S+: 4 ok, 11 failed", proc.stderr)


def test_stdin_text_completion_order_echo_and_plain_progress(tmp_path):
    prompts = ["Hello there", "", "The sky is", "{not json, but text mode}", "One two three"]
    proc = llamabatch_run("-", *FAST, "--input-format", "text", "--order", "completion", "--echo",
                          "--progress-every", "0", stdin="\n".join(prompts) + "\n")
    assert proc.returncode == 0, proc.stderr
    records = parse_records(proc.stdout)
    assert sorted(r["id"] for r in records) == [1, 3, 4, 5]
    assert {r["id"]: r["input"] for r in records} == {1: {"prompt": "Hello there"}, 3: {"prompt": "The sky is"},
                                                      4: {"prompt": "{not json, but text mode}"},
                                                      5: {"prompt": "One two three"}}
    assert all(r["error"] is None for r in records)
    # stderr is a pipe: plain progress lines (no bar, no control characters) and a summary
    assert re.search(r"^llamabatch run: \d+/\? lines, [\d.]+ tok/s \(last 5 s\), \d+/4 slots busy, 0 failed", proc.stderr, re.M)
    assert "4 line(s) in" in proc.stderr and "4 ok, 0 failed" in proc.stderr
    assert "\x1b[" not in proc.stderr


def test_input_order_waits_for_a_slow_line_and_completion_order_does_not(tmp_path):
    lines = [{"id": "slow", "prompt": "Count:", "max_tokens": 100, "ignore_eos": True}]
    lines += [{"id": f"fast{i}", "prompt": f"Word {i}:", "max_tokens": 1} for i in range(5)]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    in_order = llamabatch_run(str(inp), *FAST, "-q")
    assert in_order.returncode == 0, in_order.stderr
    assert [r["id"] for r in parse_records(in_order.stdout)] == ["slow"] + [f"fast{i}" for i in range(5)]
    assert in_order.stderr == ""  # --quiet
    # 100 ticks of 10 ms: the slow line outlasts the reader thread handing out the fast ones
    by_completion = llamabatch_run(str(inp), *FAST, "-q", "--order", "completion", step_delay=0.01)
    ids = [r["id"] for r in parse_records(by_completion.stdout)]
    assert sorted(ids) == sorted(["slow"] + [f"fast{i}" for i in range(5)])
    assert ids[-1] == "slow"  # 100 tokens vs 1: it finishes last


def test_the_config_files_run_table_sets_order_and_max_inflight_and_flags_beat_it(tmp_path):
    lines = [{"id": "slow", "prompt": "Count:", "max_tokens": 30, "ignore_eos": True}]  # 30 ticks to the others' 2
    lines += [{"id": f"fast{i}", "prompt": f"Word {i}:", "max_tokens": 1} for i in range(5)]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    config = tmp_path / "llamabatch.toml"
    config.write_text('[run]\norder = "completion"\n')

    def ids(*flags):
        result = invoke(["--config", str(config), "run", str(inp), *FAST, "-q", *flags],
                        runner=runner_for(step_delay=0.01))
        assert result.exit_code == 0, result.stderr
        return [r["id"] for r in parse_records(result.stdout)], result.engines[0]
    by_file, _ = ids()
    assert by_file[-1] == "slow" and sorted(by_file) == sorted(line["id"] for line in lines)
    assert ids("--order", "input")[0] == [line["id"] for line in lines]
    config.write_text("[run]\nmax_inflight = 1\n")
    in_order, engine = ids()
    assert in_order == [line["id"] for line in lines]  # order: the default, input
    assert max(len(p.plan.chunks) for p in engine.runner.plans) == 1  # one line in the engine at a time
    _, engine = ids("--max-inflight", "4")
    assert max(len(p.plan.chunks) for p in engine.runner.plans) > 1


def test_shared_prefix_is_served_from_the_cache(tmp_path):
    preamble = "Label each review as positive or negative.\n" + "Review: Great food.\nLabel: positive\n" * 8
    lines = [{"id": i, "prompt": preamble + f"Review: Example {i}.\nLabel:", "max_tokens": 2} for i in range(4)]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    # one slot: each line finds the previous line's tokens in it
    proc = llamabatch_run(str(inp), "--n-parallel", "1", "--n-ctx", "512", "--temperature", "0", "-q")
    assert proc.returncode == 0, proc.stderr
    usages = [r["usage"] for r in parse_records(proc.stdout)]
    assert all(u["cached_tokens"] > 50 for u in usages[1:]), usages
    assert all(u["cached_tokens"] < u["prompt_tokens"] for u in usages)


def test_empty_input_gives_empty_output_and_exit_0(tmp_path):
    inp = tmp_path / "empty.jsonl"
    inp.write_text("")
    out = tmp_path / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == ""
    assert "0 line(s) in" in proc.stderr


# -- files that can't be used: one line, exit 1, before the model loads -------------------------


def test_unreadable_input_fails_before_the_model_loads(tmp_path):
    # the model path is bad too: the INPUT message proves INPUT was checked first
    proc = llamabatch_run(str(tmp_path / "missing.jsonl"), "--model", str(tmp_path / "nope.gguf"), real_engine=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"llamabatch: error: cannot read INPUT {tmp_path / 'missing.jsonl'}: No such file or directory"]


def test_unwritable_output_fails_before_the_model_loads(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", ["hi"])
    out = tmp_path / "no-such-dir" / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), "--model", str(tmp_path / "nope.gguf"), real_engine=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"llamabatch: error: cannot write OUTPUT {out}: No such file or directory"]


def test_model_that_cannot_load_leaves_no_output_file(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", ["hi"])
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    out = tmp_path / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), "--model", str(bad), real_engine=True)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a GGUF file" in proc.stderr
    assert not out.exists()


def test_resume_needs_an_output_file(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", ["hi"])
    proc = llamabatch_run(str(inp), "--resume")
    assert proc.returncode == 2 and "--resume reads back OUTPUT" in proc.stderr


# -- crash safety and resume -------------------------------------------------------------------


@pytest.mark.model
def test_resume_after_kill_9_answers_every_line_once(tmp_path, bundled_model):
    lines = slow_lines(16, max_tokens=16)
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    args = [str(inp), "-o", str(out), *FAST, "--order", "completion", "-q"]
    proc = start_run(*args)
    try:
        written = wait_for_lines(out, 1, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert written < len(lines), "the run finished before it could be killed"
    before = read_records(out) if out.read_text().endswith("\n") else None  # a torn line is fine here
    resumed = real_run(*args[:-1], "--resume", "--progress-every", "1000")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming:" in resumed.stderr
    records = read_records(out)
    ids = [r["id"] for r in records]
    assert sorted(ids) == sorted(line["id"] for line in lines) and len(ids) == len(set(ids))
    assert all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 16 for r in records)
    if before is not None:
        assert records[:len(before)] == before  # what was there is kept, the rest appended


def test_resume_cuts_a_torn_last_line_and_respects_duplicates(tmp_path):
    lines = [{"id": "a", "prompt": "A is for"}, {"id": "b", "prompt": "B is for"}, {"id": "a", "prompt": "again"},
             {"id": "c", "prompt": "C is for"}, {"id": "d", "prompt": "D is for"}]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    # a previous run (completion order) wrote the duplicate's error and b, then died mid-record for c
    dup = {"id": "a", "text": "", "finish_reason": "error", "usage": None, "timings": None, "seed": None,
           "error": {"code": "duplicate_id", "message": "line 3: id \"a\" was already used"}}
    b = {"id": "b", "text": " hand-written", "finish_reason": "stop", "usage": None, "timings": None, "seed": 1,
         "error": None}
    out.write_text(json.dumps(dup) + "\n" + json.dumps(b) + "\n" + '{"id": "c", "text": " torn re')
    # written by hand: no manifest to check the settings against (test_run_long_jobs.py checks that)
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume", "--allow-changed-settings")
    assert proc.returncode == 0, proc.stderr
    assert "cut off a torn last line" in proc.stderr
    records = read_records(out)
    assert records[:2] == [dup, b]  # kept byte for byte
    assert [r["id"] for r in records[2:]] == ["a", "c", "d"]  # the first "a" runs; no second duplicate error
    assert all(r["error"] is None for r in records[2:])


def test_resume_refuses_an_output_with_a_broken_middle_line(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", ["hi"])
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1, "text": "ok"}\nnot json\n{"id": 2}\n')
    proc = llamabatch_run(str(inp), "-o", str(out), "--resume", "--allow-changed-settings",
                          "--model", str(tmp_path / "nope.gguf"), real_engine=True)
    assert proc.returncode == 1
    assert "line 2 is not valid JSON" in proc.stderr
    assert out.read_text() == '{"id": 1, "text": "ok"}\nnot json\n{"id": 2}\n'  # untouched


# -- Ctrl-C ------------------------------------------------------------------------------------


@pytest.mark.model
def test_ctrl_c_finishes_in_flight_lines_then_exits_130_with_the_resume_command(tmp_path, bundled_model):
    lines = slow_lines(16, max_tokens=12)
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = start_run(str(inp), "-o", str(out), *FAST, "--max-inflight", "4")
    try:
        wait_for_lines(out, 2, proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted: reading no further" in stderr
    assert re.search(r"Resume with:\n  llamabatch run .*in\.jsonl -o .*out\.jsonl .*--resume", stderr)
    records = read_records(out)
    assert 2 <= len(records) < len(lines)
    # in-flight lines were finished, not cancelled: every record is a whole answer
    assert all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 12 for r in records)
    resumed = real_run(str(inp), "-o", str(out), *FAST, "--resume", "-q")
    assert resumed.returncode == 0, resumed.stderr
    ids = [r["id"] for r in read_records(out)]
    assert sorted(ids) == sorted(line["id"] for line in lines) and len(set(ids)) == len(ids)


@pytest.mark.model
def test_second_ctrl_c_cancels_in_flight_lines(tmp_path, bundled_model):
    inp = write_lines(tmp_path / "in.jsonl", slow_lines(16, max_tokens=200))
    out = tmp_path / "out.jsonl"
    proc = start_run(str(inp), "-o", str(out), *FAST, "--progress-every", "0.05")
    try:
        deadline = time.monotonic() + 60
        while "4/4 slots busy" not in (proc.stderr.readline() or "") and time.monotonic() < deadline:
            assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "cancelling" in stderr and "--resume" in stderr
    # cancelled lines get no record: --resume will run them
    assert all(r["finish_reason"] == "length" for r in read_records(out))
    assert len(read_records(out)) < 16


def test_resume_hint_repeats_the_command_line_main_was_given():
    from llamabatch.cli.run.job_summary import resume_hint as _resume_hint

    typed = ("--config", "c.toml", "run", "in.jsonl", "-o", "out.jsonl", "--n-parallel", "4")
    hint = _resume_hint(3, "in.jsonl", "out.jsonl", typed)
    assert "3 record(s) written to out.jsonl" in hint
    assert hint.endswith("\n  llamabatch --config c.toml run in.jsonl -o out.jsonl --n-parallel 4 --resume")
    # called without a command line (an embedding caller): the minimal command that resumes
    assert _resume_hint(0, "in.jsonl", "out.jsonl", ()).endswith("\n  llamabatch run in.jsonl -o out.jsonl --resume")
