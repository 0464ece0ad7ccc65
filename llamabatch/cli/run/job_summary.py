"""The last lines of `llamabatch run` and its exit status, from the job's report: what was
written, tokens and speed, what ended the job early and how to resume it, --verify's
verdict, --fail-on-error."""
from __future__ import annotations

import shlex

from ...jobs import JobReport
from ...jobs.job_report import VerifyOutcome
from ...jobs.writing.output_sink import stream_kind
from ..exit_status import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK
from .job_view import PREFIX, Interrupts
from .progress import Reporter, clock_duration


def exit_status(report: JobReport, reporter: Reporter, interrupts: Interrupts, *, input_path: str,
                output: str | None, argv: tuple[str, ...], fail_on_error: bool) -> int:
    """Say how the job ended and return the exit status."""
    summary(reporter, report)
    for line in report.cluster_summary:
        reporter.note(line)
    code = _ending(report, reporter, interrupts, input_path, output, argv, fail_on_error)
    if report.table_error is not None:  # the table from the records file could not be made
        reporter.say(f"llamabatch: error: {report.table_error}")
        return EXIT_ERROR
    if report.table_rows is not None:
        what = "complete" if report.complete else "the rows answered so far; --resume completes it"
        reporter.note(f"{PREFIX}wrote {report.table_rows} row(s) to {output} ({what}; from {report.records_output})")
    return code


def _ending(report: JobReport, reporter: Reporter, interrupts: Interrupts, input_path: str, output: str | None,
            argv: tuple[str, ...], fail_on_error: bool) -> int:
    hint = resume_hint(report.written, input_path, output, argv)
    fatal = report.error if report.error != report.table_error else None
    if report.read_note is not None:
        reporter.say(PREFIX + report.read_note)
    if fatal is not None:
        reporter.say(f"llamabatch: error: {fatal}")
        if not report.output_failed or report.resumable:  # every record in OUTPUT is whole (a torn last one is cut on resume)
            reporter.say(hint)
        return EXIT_ERROR
    if report.stopped:
        reporter.say(hint)
        return 128 + interrupts.first if interrupts.first else EXIT_INTERRUPTED
    if report.verify is not None and not verified(report.verify, reporter):
        return EXIT_ERROR
    if fail_on_error and report.failed:
        return EXIT_ERROR
    return EXIT_OK


def summary(reporter: Reporter, report: JobReport) -> None:
    wall = report.elapsed_s
    line = (f"{PREFIX}{report.written} {report.unit}(s) in {clock_duration(wall)}: {report.ok} ok, "
            f"{report.failed} failed")
    if report.already_answered:
        line += f"; {report.already_answered} already in OUTPUT"
    cancelled = report.not_written - report.not_started
    if cancelled:
        stuck = f"; {report.abandoned} of them still running when the drain time ran out" if report.abandoned else ""
        line += f"; {cancelled} cancelled (not written{stuck})"
    if report.not_started:
        line += f"; {report.not_started} read ahead and not started (not written)"
    reporter.note(line)
    if report.restarts and not report.cluster_summary:  # the pool tells its workers' restarts
        isolated = ", ".join(repr(i) for i in report.isolated) or "none"
        hung = f" ({report.hangs} of them hung: killed by the watchdog)" if report.hangs else ""
        reporter.note(f"{PREFIX}the engine process crashed and was restarted {report.restarts} time(s){hung}; "
                      f"isolated: {isolated}")
    elif report.isolated and not report.cluster_summary:  # in this process: found by the crash journal on resume
        reporter.note(f"{PREFIX}not run again, as they took the engine's process down in earlier runs: "
                      + ", ".join(repr(i) for i in report.isolated))
    t = report.tokens
    share = f"{100 * t.cached / t.prompt:.0f}%" if t.prompt else "0%"
    disk = f"; {t.restored} of them from the disk prefix store" if t.restored else ""
    reporter.note(f"{PREFIX}prompt tokens {t.prompt} ({t.cached} cached, {share}{disk}), "
                  f"generated {t.generated}, {wall:.1f}s wall, "
                  f"{t.generated / wall if wall > 0 else 0:.1f} generated tok/s")
    guessed = t.accepted_prediction + t.rejected_prediction
    if guessed:  # speculative decoding (docs/speculative.md)
        reporter.note(f"{PREFIX}speculative decoding: {t.accepted_prediction} of {guessed} guessed "
                      f"token(s) kept ({100 * t.accepted_prediction / guessed:.0f}%), "
                      f"{100 * t.accepted_prediction / max(t.generated, 1):.0f}% of the generated")
    if t.preempted:  # priority: lines put aside for higher-priority ones, resumed where they stopped
        reporter.note(f"{PREFIX}preempted: {t.preempted} line(s) waited {t.paused_s:.1f}s in all for "
                      "higher-priority lines (their KV kept; answers unchanged)")
    if t.grammar_backends:  # which backend constrained the structured lines (docs/structured-output.md)
        ways = {"llguidance": "as llguidance token masks", "llama": "through llama.cpp's grammar sampler"}
        parts = ", ".join(f"{n} line(s) {ways.get(b, b)}" for b, n in sorted(t.grammar_backends.items()))
        reporter.note(f"{PREFIX}structured output: {parts}; {t.forced} token(s) forced by the grammar")


def verified(outcome: VerifyOutcome, reporter: Reporter) -> bool:
    """--verify: say what the re-runs found (always, even with -q); False when any differ."""
    if not outcome.samples:
        reporter.say(f"{PREFIX}verify: no finished line to re-run")
        return True
    reporter.note(f"{PREFIX}verify: re-running {outcome.samples} of {outcome.seen} finished line(s) one at a time")
    n = outcome.samples
    if not outcome.differences:
        reporter.say(f"{PREFIX}verified {n}/{n} identical")
        return True
    reporter.say(f"{PREFIX}verify: {len(outcome.differences)} of {n} differ: "
                 + ", ".join(repr(key) for key, _why in outcome.differences))
    for key, why in outcome.differences:
        reporter.say(f"{PREFIX}verify: id {key!r}: {why}")
    if not outcome.deterministic:
        reporter.say(f"{PREFIX}verify: without --deterministic, output may depend on the batch")
    return False


def resume_hint(written: int, input_path: str, output: str | None, argv: tuple[str, ...]) -> str:
    if output in (None, "-"):
        return (f"{PREFIX}stopped early; {written} record(s) went to stdout. To finish the rest, "
                f"run again with -o FILE (the file stdout went to) and --resume")
    if stream_kind(output) is not None:  # a pipe or FIFO cannot be read back: the same advice as stdout
        return (f"{PREFIX}stopped early; {written} record(s) went to {output}. To finish the rest, "
                f"run again with -o FILE (the file they were saved to) and --resume")
    args = list(argv)
    if "run" in args:  # the command as typed, with every option kept
        command = shlex.join(["llamabatch", *args] + ([] if "--resume" in args else ["--resume"]))
    else:
        command = shlex.join(["llamabatch", "run", input_path, "-o", output, "--resume"])
    return f"{PREFIX}stopped early; {written} record(s) written to {output} this run. Resume with:\n  {command}"
