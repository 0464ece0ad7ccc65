"""The README's first command, as a new user runs it: `llamabatch run examples/prompts.jsonl`
with no model named, after the README's install (which puts the chat-tuned SmolLM2 there).

Guards against the bundled Gemma 3 270M base model answering the file's chat lines by echoing their
instructions, as it once did ("You are a model. Answer in one or two short sentences… mendatang").
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"
CAPITALS = {"capital-fr": "Paris", "capital-jp": "Tokyo", "capital-de": "Berlin", "capital-uk": "London"}


def test_the_readmes_first_command_answers_every_example_line(smollm2_path, tmp_path):
    # a new user's environment, but the suite's own prefix store and cache folder (conftest.py)
    kept = ("LLAMABATCH_PREFIX_STORE", "LLAMABATCH_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMABATCH_") or k in kept}
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(EXAMPLES)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    header = proc.stderr.splitlines()[0]
    assert header.startswith("llamabatch run: smollm2 (the chat-tuned default; -m gemma for the base model), "), header
    lines = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    records = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(records) == {line["id"] for line in lines}
    for line in lines:
        record = records[line["id"]]
        text = record["text"]
        assert record["error"] is None and text.strip(), record
        if line["id"] in CAPITALS:
            assert text.strip() == CAPITALS[line["id"]], record
        for message in line.get("messages", []):  # an answer, not the instructions read back
            assert message["content"][:24] not in text, record
        assert "<|im_" not in text and "<start_of_turn>" not in text, record
        if "messages" in line:  # a sentence or two that ends, not one cut at max_tokens
            assert len(text.split()) >= 5, record
