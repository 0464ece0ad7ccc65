"""Batch jobs: lines and tables in, records and tables out, resumable (docs/library.md).

    from llamabatch.jobs import run_job

    report = run_job("prompts.jsonl", "results.jsonl", temperature=0, max_tokens=64)
    print(report.ok, report.failed, report.output)

`llamabatch run` is this package behind a command line. The job itself is here (job.py:
run_job, start_job; job_opening.py, job_running.py, batch_loop.py, batch_watch.py; its settings,
events and report); its rooms:

    reading/    INPUT, the context it needs, the order lines start in
    writing/    OUTPUT, the record writer, --error-file, the lock on OUTPUT
    resume/     the manifest, fingerprint, journals and ids that make a run resumable; verify
    tables/     tables in and out
    estimates/  the dry run

Line parsing and records are the OpenAI request format's (llamabatch/openai_format/).
"""
from __future__ import annotations

from .events import Abandoned, Done, JobEvent, LineFinished, Notice, Progress, Started, Stopping
from .job import Job, estimate_job, run_job, start_job
from .job_report import JobReport, Tokens, VerifyOutcome
from .job_spec import JobHost, JobSpec
from .progress import Snapshot
from .resume.resumable_output import SettingsChanged

__all__ = [
    "run_job", "start_job", "estimate_job", "run_frame", "Job", "JobReport", "JobHost", "JobSpec", "JobEvent",
    "Started", "Progress", "LineFinished", "Stopping", "Abandoned", "Notice", "Done", "Snapshot", "Tokens",
    "VerifyOutcome", "SettingsChanged",
]


def __getattr__(name: str):
    if name == "run_frame":  # frames.py: imported when first used
        from .frames import run_frame

        return run_frame
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
