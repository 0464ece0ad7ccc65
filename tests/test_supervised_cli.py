"""`run` and `serve-stdin` through a planted crash, on the bundled model (see test_supervised.py
for the hook). Small slots and 4 tokens per line keep each to a few seconds plus restarts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamabatch.supervised import ENGINE_CRASHED
from llamabatch.supervised.child import CRASH_AT_LOAD_ENV, CRASH_PROMPT_ENV

pytestmark = pytest.mark.model

DOOMED = "this prompt makes the child abort"


@pytest.fixture(autouse=True)
def _bundled_model(model_path):
    """The parent resolves the bundled model before starting a child (assembled once)."""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LLAMABATCH_MODEL"}
    env.update(extra)
    return env


FAST = ["--n-parallel", "4", "--n-ctx", "1024", "--max-tokens", "4", "--temperature", "0", "--threads", "1"]


def llamabatch(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamabatch", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env=child_env(**env))


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_grammar_that_aborted_llama_cpp_is_one_error_record(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id":"r1","prompt":"x","max_tokens":4,"grammar":"root ::= \\"\\\\u0000\\""}\n'
                   '{"id":"r2","prompt":"hello","max_tokens":4}\n')
    proc = llamabatch("run", str(inp), *FAST)
    assert proc.returncode == 0, proc.stderr
    r1, r2 = [json.loads(line) for line in proc.stdout.splitlines()]
    assert r1["id"] == "r1" and r1["error"]["code"] == "invalid_request" and "NUL" in r1["error"]["message"]
    assert r2["id"] == "r2" and r2["error"] is None and r2["finish_reason"] == "length"
    assert llamabatch("run", str(inp), *FAST, "--fail-on-error").returncode == 1


def test_run_planted_crash_in_40_lines_gives_39_records_and_1_engine_crashed(tmp_path):
    lines = [{"id": f"q{i}", "prompt": DOOMED if i == 20 else f"Count from {i}:"} for i in range(40)]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = llamabatch("run", str(inp), "-o", str(out), *FAST, **{CRASH_PROMPT_ENV: DOOMED})
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"q{i}" for i in range(40)]  # each once, in input order
    crashed = [r for r in records if r["error"]]
    assert [r["id"] for r in crashed] == ["q20"] and crashed[0]["error"]["code"] == ENGINE_CRASHED
    assert all(r["finish_reason"] == "length" for r in records if r["id"] != "q20")
    assert "restarted" in proc.stderr and "isolated: 'q20'" in proc.stderr


def test_run_child_dying_at_load_is_exit_1_with_one_line(tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "hi"}])
    out = tmp_path / "out.jsonl"
    proc = llamabatch("run", str(inp), "-o", str(out), *FAST, **{CRASH_AT_LOAD_ENV: "1"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llamabatch: error: the engine process died"), proc.stderr
    assert not out.exists()  # nothing was written: the same command runs everything later


def test_serve_stdin_keeps_serving_other_requests_through_a_crash():
    requests = [{"id": f"s{i}", "prompt": f"Count from {i}:", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                 "stream": True} for i in range(6)]
    requests.insert(3, {"id": "bad", "prompt": DOOMED, "max_tokens": 8})
    stdin = "".join(json.dumps(r) + "\n" for r in requests) + '{"op": "stats", "id": "st"}\n'
    proc = llamabatch("serve-stdin", "--n-parallel", "4", "--n-ctx", "1024", "--threads", "1", stdin=stdin,
                      **{CRASH_PROMPT_ENV: DOOMED})
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    ends = {e["id"]: e for e in events if e["event"] in ("done", "error") and e.get("id", "").startswith(("s", "b"))}
    assert len([e for e in events if e["event"] in ("done", "error") and e.get("id") != "st"]) == 7  # one each
    assert ends["bad"]["event"] == "error" and ends["bad"]["error"]["code"] == ENGINE_CRASHED
    for r in requests:
        if r["id"] != "bad":
            assert ends[r["id"]]["event"] == "done" and ends[r["id"]]["finish_reason"] == "length"
            tokens = "".join(e["text"] for e in events if e["event"] == "token" and e["id"] == r["id"])
            assert tokens == ends[r["id"]]["text"]  # no token event twice across the retry
