"""Lines longer than 4,096 tokens with default settings (n_ctx auto), on both bundled families,
through `llamabatch run` as a user runs it; an explicit --n-ctx still honoured exactly; and a
pool the slots share (--kv-unified) admitting a long request by room."""
from __future__ import annotations

import json
import random
import subprocess
import sys

WORDS = ("river stone garden market window silver orange engine harbor winter lantern meadow copper signal violet "
         "anchor feather canyon marble thunder velvet orchard compass glacier ribbon falcon pepper").split()


def document(seed: int, words: int = 4300) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "\nQuestion: which word opens this text? Answer:"


def write(path, long: int, short: int) -> None:
    lines = [{"id": f"L{i}", "prompt": document(i), "max_tokens": 4, "temperature": 0} for i in range(long)]
    lines += [{"id": f"s{i}", "prompt": f"Name a colour number {i}:", "max_tokens": 4, "temperature": 0}
              for i in range(short)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def run(model: str, path, *args: str) -> tuple[list[dict], str]:
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(path), "-m", model,
                           "-o", "-", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def test_a_document_longer_than_a_default_slot_is_answered_with_default_settings(family, tmp_path):
    path = tmp_path / "in.jsonl"
    write(path, long=1, short=3)
    records, err = run(family.path, path, "--n-parallel", "4")
    assert [r["error"] for r in records] == [None] * 4, err[-1500:]
    long = records[0]
    assert long["usage"]["prompt_tokens"] > 4096 and long["usage"]["completion_tokens"] >= 1
    header = next(line for line in err.splitlines() if " slots x " in line)
    assert "n_ctx auto: 4 slots x 4,352 tokens" in header and "the longest line needs" in header


def test_an_explicit_n_ctx_is_honoured_exactly(model_path, tmp_path):
    path = tmp_path / "in.jsonl"
    write(path, long=1, short=1)
    records, err = run(model_path, path, "--n-ctx", "4096", "--n-parallel", "1")
    assert "1 slots x 4096 tokens" in err or "1 slots x 4,096 tokens" in err, err[-1500:]
    assert records[0]["error"]["code"] == "context_overflow"
    message = records[0]["error"]["message"]
    assert "a slot holds 4,096" in message and "--n-ctx" in message
    assert records[1]["error"] is None


def test_a_shared_pool_runs_a_request_longer_than_an_even_share_when_there_is_room(model_path, tmp_path):
    # --kv-unified with 2,048 cells for 4 slots: an even share is 512, the long line ~1,000
    # tokens (small, so the test costs a short prefill; the rule is the same at any size)
    path = tmp_path / "in.jsonl"
    lines = [{"id": "L0", "prompt": document(0, words=1000), "max_tokens": 4, "temperature": 0}]
    lines += [{"id": f"s{i}", "prompt": f"Name a colour number {i}:", "max_tokens": 4, "temperature": 0}
              for i in range(3)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records, err = run(model_path, path, "--kv-unified", "--n-ctx", "2048", "--n-parallel", "4")
    assert [r["error"] for r in records] == [None] * 4, err[-1500:]
    assert records[0]["usage"]["prompt_tokens"] > 512
