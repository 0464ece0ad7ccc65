"""llamabatch.jobs from Python: run_job, start_job and its Job, estimate_job, on the scripted
fake runner (a shared Engine, or the job's own engine through JobHost.open_engine)."""
from __future__ import annotations

import json
import threading

import pytest

import llamabatch
from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.errors import InvalidRequest, JobFileError
from llamabatch.jobs import (Done, JobHost, LineFinished, Notice, Progress, Started, estimate_job, run_job,
                             start_job)
from llamabatch.jobs.resume.manifest import manifest_path, read_manifest

from cli_harness import FakeEngines, runner_for
from fake_runner import FakeRunner


def shared_engine(step_delay: float = 0.0, n_parallel: int = 2) -> Engine:
    runner = FakeRunner(n_slots=n_parallel, slot_ctx=64, n_batch=64, step_delay=step_delay,
                        reply=lambda prompt: prompt[::-1][:6])
    return Engine(EngineConfig(n_parallel=n_parallel, n_batch=64, chunk_size=16), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=8))


def write_lines(path, lines) -> str:
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    return str(path)


def records(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


GOOD = [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(3)]
BAD = ['{"id": "broken", "prompt": ', {"id": "nothing"}]  # not JSON; neither prompt nor messages


def test_run_job_counts_ok_and_failed_lines_and_routes_failures_to_the_error_file(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD + BAD)
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    with shared_engine() as engine:
        report = run_job(inp, str(out), engine=engine, error_file=str(errors))
        assert (report.ok, report.failed, report.lines) == (3, 2, 5)
        assert not report.cancelled and not report.interrupted and report.error is None and report.complete
        assert report.output == str(out) and report.error_file == str(errors)
        assert report.manifest == manifest_path(str(out)) and read_manifest(report.manifest)["status"] == "finished"
        assert sorted(r["id"] for r in records(out)) == ["q0", "q1", "q2"]
        assert all(r["error"] is None and r["text"] for r in records(out))
        assert sorted(r["error"]["code"] for r in records(errors)) == ["invalid_json", "unknown_shape"]
        # the shared engine is the caller's: still open and answering
        assert engine.generate(["still here"], SamplingParams(max_tokens=2))[0].finish_reason in ("stop", "length")


def test_openai_batch_lines_get_openai_batch_output_records(tmp_path):
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "abc"}}
    inp = write_lines(tmp_path / "in.jsonl", [line])
    with shared_engine() as engine:
        report = run_job(inp, str(tmp_path / "out.jsonl"), engine=engine)
    (record,) = records(tmp_path / "out.jsonl")
    assert report.ok == 1 and record["custom_id"] == "c1"
    assert record["response"]["body"]["object"] == "text_completion"


def test_events_come_in_order_and_every_line_finishes_once(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD + BAD)
    seen = []
    with shared_engine() as engine:
        report = run_job(inp, str(tmp_path / "out.jsonl"), engine=engine, on_event=seen.append)
    assert isinstance(seen[0], Started) and isinstance(seen[-1], Done) and seen[-1].report == report
    finished = [e for e in seen if isinstance(e, LineFinished)]
    assert sorted(e.line_no for e in finished) == [1, 2, 3, 4, 5]
    assert sum(not e.ok for e in finished) == 2 and all(e.code and e.message for e in finished if not e.ok)
    assert any(isinstance(e, Progress) and e.snapshot.done == 5 for e in seen)


def interrupted_then_resumed(tmp_path, stop) -> tuple[object, object, list[dict]]:
    """A 60-line job stopped by `stop(job or event)` midway, then run again with resume=True."""
    lines = [{"id": i, "prompt": f"line number {i}"} for i in range(60)]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = str(tmp_path / "out.jsonl")
    with shared_engine(step_delay=0.01) as engine:
        first = stop(inp, out, engine)
        partial = records(out)
        second = run_job(inp, out, engine=engine, resume=True)
    return first, second, partial


def test_cancel_leaves_whole_files_and_a_resume_gives_each_line_once(tmp_path):
    def cancel_after_five(inp, out, engine):
        job = start_job(inp, out, engine=engine, max_inflight=2)
        for event in job.events():
            if isinstance(event, LineFinished) and event.line_no >= 5:
                job.cancel()
        return job.wait(timeout=30)

    first, second, partial = interrupted_then_resumed(tmp_path, cancel_after_five)
    assert first.cancelled and not first.complete and 5 <= first.written < 60
    assert len(partial) == first.written  # every record whole, one per line
    assert read_manifest(manifest_path(str(tmp_path / "out.jsonl")))["status"] == "finished"
    assert not (tmp_path / "out.jsonl.lock").exists()
    assert second.already_answered == first.written and second.ok == 60 - first.written
    ids = [r["id"] for r in records(tmp_path / "out.jsonl")]
    assert sorted(ids) == list(range(60))  # each line exactly once


def test_ctrl_c_during_run_job_stops_it_resumably(tmp_path):
    def ctrl_c_once(inp, out, engine):
        presses = []

        def on_event(event):
            if isinstance(event, LineFinished) and not presses:
                presses.append(event)
                raise KeyboardInterrupt

        return run_job(inp, out, engine=engine, max_inflight=2, on_event=on_event)

    first, second, partial = interrupted_then_resumed(tmp_path, ctrl_c_once)
    assert first.interrupted and not first.cancelled and first.written < 60
    assert sorted(r["id"] for r in records(tmp_path / "out.jsonl")) == list(range(60))
    assert second.written + first.written == 60


def test_the_cancel_event_stops_run_job(tmp_path):
    def cancel_event(inp, out, engine):
        stop = threading.Event()

        def on_event(event):
            if isinstance(event, LineFinished):
                stop.set()

        return run_job(inp, out, engine=engine, max_inflight=2, cancel=stop, on_event=on_event)

    first, second, _partial = interrupted_then_resumed(tmp_path, cancel_event)
    assert first.cancelled and first.written < 60 and second.complete


def test_a_job_opens_its_own_engine_through_the_host_and_closes_it(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD)
    engines: list = []
    factory = FakeEngines(runner_for(lambda p: "ok"), engines)
    host = JobHost(engine_factory=factory, config_path=str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    report = run_job(inp, str(tmp_path / "out.jsonl"), host=host, n_parallel=2, temperature=0, isolate=False)
    assert report.ok == 3 and len(engines) == 1
    with pytest.raises(llamabatch.EngineClosed):
        engines[0].submit("after the job", stream=False).result()


def test_bad_settings_raise_invalid_request_before_anything_is_written(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    with shared_engine() as engine:
        for settings, words in [({"sideways": 1}, "unknown setting 'sideways'"),
                                ({"order": "sideways"}, "order must be one of"),
                                ({"max_inflight": 0}, "max_inflight must be an integer >= 1"),
                                ({"n_parallel": 4}, "n_parallel is a setting of the engine"),
                                ({"retry_failed": True}, "use it with --resume")]:
            with pytest.raises(InvalidRequest, match=words):
                run_job(inp, str(out), engine=engine, **settings)
        assert not out.exists()
        with pytest.raises(JobFileError, match="cannot read INPUT"):
            run_job(str(tmp_path / "missing.jsonl"), str(out), engine=engine)
        assert not out.exists()


def test_estimate_job_reads_and_tokenizes_every_line_and_writes_nothing(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD + BAD)
    engines: list = []
    host = JobHost(engine_factory=FakeEngines(runner_for(), engines))
    estimate = estimate_job(inp, str(tmp_path / "out.jsonl"), host=host, n_parallel=2)
    assert (estimate["lines"], estimate["valid"], estimate["invalid"]) == (5, 3, 2)
    assert estimate["prompt_tokens"]["total"] == sum(len(f"question {i}") for i in range(3))
    assert estimate["slots"]["n_parallel"] == 2
    assert not (tmp_path / "out.jsonl").exists()


def test_notices_say_what_a_resume_found(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD)
    out = str(tmp_path / "out.jsonl")
    with shared_engine() as engine:
        run_job(inp, out, engine=engine)
        seen = []
        report = run_job(inp, out, engine=engine, resume=True, on_event=seen.append)
    assert report.already_answered == 3 and report.written == 0
    assert any(isinstance(e, Notice) and "resuming: 3 record(s) already in" in e.text for e in seen)


def test_the_package_root_exports_run_job_lazily():
    assert llamabatch.run_job is run_job
    from llamabatch.jobs import run_frame

    assert llamabatch.run_frame is run_frame


def test_a_job_nobody_follows_keeps_one_event_per_line_and_one_snapshot(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", [{"id": i, "prompt": f"p{i}"} for i in range(40)])
    with shared_engine(step_delay=0.005) as engine:
        job = start_job(inp, str(tmp_path / "out.jsonl"), engine=engine)
        report = job.wait(timeout=60)  # events left untaken while the job ran
        kept = list(job.events())
    assert report.ok == 40 and isinstance(kept[-1], Done)
    assert sum(isinstance(e, LineFinished) for e in kept) == 40
    progress = [e for e in kept if isinstance(e, Progress)]
    assert len(progress) == 1 and progress[0].snapshot.done == 40  # the latest snapshot only
