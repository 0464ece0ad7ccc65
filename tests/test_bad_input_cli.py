"""Bad inputs through the installed commands on the bundled model: each once hung a
run, ended it, slowed the batch by tens of seconds or printed a traceback."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
FAST = ["--n-parallel", "2", "--n-ctx", "512", "--max-tokens", "2", "--temperature", "0", "--threads", "1"]


@pytest.fixture(autouse=True)
def _bundled_model(model_path, monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)


def llamabatch(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamabatch", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def test_run_answers_each_hostile_line_once_and_finishes(tmp_path):
    lines = [
        json.dumps({"id": "s1", "prompt": "\ud800", "max_tokens": 2}),  # once: hung at "0/2 lines"
        json.dumps({"id": "s2", "prompt": "hi", "max_tokens": 2}),
        "[" * 100_000 + "]" * 100_000,  # once: "reading INPUT failed", exit 1, nothing after it ran
        '{"id": "big", "prompt": "x", "max_tokens": ' + "9" * 5000 + "}",
        json.dumps({"id": "g", "prompt": "x", "grammar": "root ::= nothing-defined"}),  # once: printed on stderr
        # once: 23 s and 49 s for a 4-token request, the whole batch stalled behind it
        json.dumps({"id": "win", "prompt": "Count:", "max_tokens": 4, "ignore_eos": True, "repeat_penalty": 1.1,
                    "penalty_last_n": 2**31 - 1, "dry_multiplier": 0.8, "dry_penalty_last_n": 2**31 - 1}),
        # found by benchmarks/fuzz_sampling.py: banning every end-of-generation token under a grammar
        # left no token once the grammar was complete, and llama.cpp aborted the process
        json.dumps({"id": "ban", "prompt": "x", "grammar": 'root ::= "a"', "max_tokens": 4,
                    "logit_bias": {"1": -math.inf, "106": -math.inf, "212": -math.inf}}),
        "\x00" * 64,  # a NUL-filled block in a .jsonl file: never a prompt
        "a text line in a JSON-lines file",
        json.dumps({"id": "last", "prompt": "bye"}),
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    proc = llamabatch("run", str(inp), "-o", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "error parsing grammar" not in proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # the lines that are no JSON have no id (null): their messages name them
    assert [r["id"] for r in records] == ["s1", "s2", None, None, "g", "win", "ban", None, None, "last"]
    by_id = {r["id"]: r for r in records}
    codes = [(r["id"], (r["error"] or {}).get("code")) for r in records]
    assert codes == [("s1", "invalid_request"), ("s2", None), (None, "invalid_json"), (None, "invalid_json"),
                     ("g", "invalid_request"), ("win", None), ("ban", None), (None, "invalid_json"),
                     (None, "invalid_json"), ("last", None)]
    assert (by_id["ban"]["text"], by_id["ban"]["finish_reason"]) == ("a", "stop")
    # llama.cpp's own complaint, in the record instead of on stderr
    assert "Undefined rule identifier 'nothing-defined'" in by_id["g"]["error"]["message"]
    win = by_id["win"]
    assert win["usage"]["completion_tokens"] == 4
    assert win["timings"]["prompt_ms"] + win["timings"]["decode_ms"] < 10_000, win["timings"]


def test_serve_stdin_answers_a_surrogate_request_by_id_and_exits_at_eof():
    requests = [json.dumps({"id": "s1", "prompt": "\ud800", "max_tokens": 2}),
                json.dumps({"id": "s2", "prompt": "hi", "max_tokens": 2}),
                '{"id": "d1", "prompt": ' + "[" * 50_000]
    proc = llamabatch("serve-stdin", *FAST, stdin="\n".join(requests) + "\n", timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    terminal = {e.get("id"): e for e in events if e["event"] in ("done", "error")}
    assert set(terminal) == {"s1", "s2", "d1"}
    assert terminal["s1"]["error"]["code"] == "invalid_request" and "lone surrogate" in terminal["s1"]["error"]["message"]
    assert terminal["s2"]["event"] == "done"
    assert terminal["d1"]["error"]["code"] == "invalid_json"
    assert "Traceback" not in proc.stderr


def test_run_with_stdin_closed_or_output_on_a_full_disk_says_so_in_one_line(tmp_path):
    closed = subprocess.run(["sh", "-c", 'exec "$0" -m llamabatch run - <&-', sys.executable],
                            capture_output=True, text=True, timeout=60)
    assert closed.returncode == 1
    assert closed.stderr.strip() == "llamabatch: error: cannot read INPUT -: stdin is closed"
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    full = llamabatch("run", str(inp), "-o", "/dev/full", *FAST, "-q")
    assert full.returncode == 1
    assert "llamabatch: error: cannot write OUTPUT /dev/full: No space left on device" in full.stderr
    assert "Traceback" not in full.stderr and "Invalid argument" not in full.stderr
