"""A stopped job's report adds up: every line read is ok, failed, already answered or not
written, the lines read ahead that never started included (a resume runs them)."""
from __future__ import annotations

import json

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.cli.run.job_summary import summary
from llamabatch.jobs import JobReport, LineFinished, run_job, start_job

from fake_runner import FakeRunner

LINES = 60


def shared_engine() -> Engine:
    runner = FakeRunner(n_slots=2, slot_ctx=64, n_batch=64, step_delay=0.01, reply=lambda prompt: prompt[::-1][:6])
    return Engine(EngineConfig(n_parallel=2, n_batch=64, chunk_size=16), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=8))


def input_file(tmp_path) -> str:
    path = tmp_path / "in.jsonl"
    lines = [{"id": i, "prompt": f"line number {i}"} for i in range(LINES)]
    lines[3] = {"id": 3, "prompt": "x", "max_tokens": "ten"}  # one failed line among them
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def adds_up(report: JobReport) -> bool:
    return report.ok + report.failed + report.already_answered + report.not_written == report.lines


def test_ctrl_c_counts_the_lines_read_ahead_as_not_written(tmp_path):
    inp, out = input_file(tmp_path), str(tmp_path / "out.jsonl")
    presses: list = []

    def on_event(event) -> None:
        if isinstance(event, LineFinished) and event.ok and not presses:
            presses.append(event)
            raise KeyboardInterrupt

    with shared_engine() as engine:
        report = run_job(inp, out, engine=engine, max_inflight=2, on_event=on_event)
        assert report.interrupted and report.lines < LINES
        assert report.not_started > 0 and report.not_started <= report.not_written
        assert adds_up(report), report
        resumed = run_job(inp, out, engine=engine, resume=True)
    assert resumed.already_answered == report.written and resumed.written == LINES - report.written
    assert adds_up(resumed) and resumed.lines == LINES


def test_cancel_counts_them_too_and_the_summary_names_them(tmp_path):
    inp, out = input_file(tmp_path), str(tmp_path / "out.jsonl")
    with shared_engine() as engine:
        job = start_job(inp, out, engine=engine, max_inflight=2)
        for event in job.events():
            if isinstance(event, LineFinished) and event.line_no >= 5:
                job.cancel()
        report = job.wait(timeout=30)
    assert report.cancelled and report.not_started > 0 and adds_up(report), report
    said: list[str] = []

    class Notes:
        def note(self, message: str) -> None:
            said.append(message)

    summary(Notes(), report)  # type: ignore[arg-type]
    assert f"; {report.not_started} read ahead and not started (not written)" in said[0]
