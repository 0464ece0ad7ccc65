"""run_job on the bundled model: examples/prompts.jsonl, each line once, resumable (marked model)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamabatch.jobs import LineFinished, run_job
from llamabatch.jobs.resume.manifest import read_manifest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"
SMALL = dict(n_parallel=4, n_ctx=1024, max_tokens=4, temperature=0)


@pytest.mark.model
def test_run_job_answers_the_example_prompts_with_the_bundled_model(model_path, tmp_path):
    # the example lines, each capped at SMALL's max_tokens: a line's own max_tokens (up to 64)
    # wins over run_job's, and what is checked here is which lines are answered, not how long
    examples = tmp_path / "prompts.jsonl"
    lines = [json.dumps({**json.loads(line), "max_tokens": SMALL["max_tokens"]})
             for line in EXAMPLES.read_text().splitlines() if line.strip()]
    examples.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    stopped = []

    def stop_after_three(event):
        if isinstance(event, LineFinished) and len(stopped) < 1 and event.line_no >= 3:
            stopped.append(event)
            raise KeyboardInterrupt  # what Ctrl-C does in the caller's thread

    first = run_job(str(examples), str(out), model=model_path, isolate=False, max_inflight=2,
                    on_event=stop_after_three, **SMALL)
    assert first.interrupted and first.written >= 1 and first.error is None
    second = run_job(str(examples), str(out), model=model_path, isolate=False, resume=True, **SMALL)
    assert second.complete and second.already_answered == first.written
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r.get("custom_id", r.get("id")) for r in records]
    assert len(records) == len(lines) == len(set(ids))  # each line exactly once
    assert first.ok + first.failed + second.ok + second.failed == len(lines)
    manifest = read_manifest(second.manifest)
    assert manifest["status"] == "finished" and [h["event"] for h in manifest["history"]] == ["start", "resume"]
