"""Running an opened job on its own thread: the batch loop and its watch, then closing the
files (the manifest's end, a retry merge, a table OUTPUT made from its records), the
verification re-runs, and the report.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

from .batch_loop import BatchLoop
from .batch_watch import StopRequests, watch
from .events import LineFinished
from .reading.input_source import LineCounter
from .job_opening import OpenedJob
from .job_report import JobReport, Tokens, VerifyOutcome
from ..openai_format import LineError, LineRequest
from .resume.manifest import manifest_path
from .writing.record_writer import RecordWriter
from .resume.verify import Reservoir, rerun_alone
from ..errors import JobFileError
from ..results import Result

# Finished lines that may wait behind a slow one in input order, per max_inflight.
REORDER_WINDOW_FACTOR = 8


def run_opened(opened: OpenedJob, stops: StopRequests, interrupted: Callable[[], bool]) -> JobReport:
    """Run every line, close everything (the job's own engine too), and report."""
    resumable = opened.sink.is_regular_file  # asked now: the sink is closed before the end is told
    try:
        run, writer, reservoir, complete = _run_lines(opened, stops)
        verify = None
        if reservoir is not None and complete and _fatal_error(opened, run, writer) is None:
            verify = verify_sample(opened.engine, reservoir, opened.resolved.engine.deterministic)
    finally:
        if opened.owns_engine:
            opened.engine.close()
        if not opened.tables.reads_table:
            opened.source.close()
    table_rows, table_error = _write_table(opened)
    opened.tables.close()
    opened.files.release()
    report = _report(opened, run, writer, stops, interrupted(), verify, table_rows, table_error)
    return dataclasses.replace(report, resumable=resumable)


def _run_lines(opened: OpenedJob, stops: StopRequests) -> tuple[BatchLoop, RecordWriter, Reservoir | None, bool]:
    spec, engine, cluster = opened.spec, opened.engine, opened.cluster
    # Admitted lines not yet written: those in the engine, those waiting to start (reorder
    # window), and in input order the finished ones waiting behind a slow one.
    waiting = max(1, opened.reorder_window)
    in_order = spec.order == "input"
    window = threading.Semaphore((opened.inflight * REORDER_WINDOW_FACTOR if in_order else opened.inflight) + waiting)
    unit = getattr(opened.source, "unit", "line")

    def finished(item: LineRequest | LineError, result: Result, bad: bool) -> None:
        code = (result.error_code or result.finish_reason) if bad else None
        message = (result.error or f"finish_reason {result.finish_reason}") if bad else None
        opened.tell(LineFinished(item.line_no, item.id, not bad, code, message, unit))

    writer = RecordWriter(opened.sink, engine.model_name, spec.order, window,
                          deterministic=opened.resolved.engine.deterministic, route=opened.files.routes(),
                          on_record=finished)
    reservoir = Reservoir(spec.verify) if spec.verify else None
    run = BatchLoop(engine, opened.parser, opened.source, writer, window, max_inflight=opened.inflight,
                    answered=opened.answered, reorder_window=opened.reorder_window, start_last=opened.start_last,
                    # a Ray worker holds 2 x its slots (cluster/startup.py): the pool's slots, near enough
                    slots=max(1, cluster.inflight_cap // 2) if cluster else engine.config.n_parallel,
                    crashes=opened.files.crashes,
                    on_result=(lambda item, result: reservoir.offer(item.id, item.prompt, item.params, result))
                    if reservoir else None)
    counter = LineCounter(opened.source.name) if opened.source.is_file else opened.tables.counter()
    complete = False
    try:
        run.start()
        watch(run, stops, opened.tell, counter, cluster, drain_timeout=opened.bounds.drain_timeout_s)
    finally:
        writer.close()
        opened.sink.close()
        complete = not run.stopping and run.read_error is None and writer.error is None
        run.clock.stop()  # the lines' time: verification and the table are not in elapsed_s
        opened.files.end(complete=complete, wall_s=run.clock.elapsed(), written=writer.stats.written,
                         generated=writer.stats.completion_tokens, ray=cluster.describe() if cluster else None,
                         input_ids=run.seen_ids if complete else None)
    return run, writer, reservoir, complete


def verify_sample(engine: Any, reservoir: Reservoir, deterministic: bool) -> VerifyOutcome:
    """`verify=N`: re-run the sampled lines alone and compare their tokens."""
    samples = reservoir.samples
    differences = rerun_alone(engine, samples) if samples else []
    return VerifyOutcome(seen=reservoir.seen, deterministic=deterministic, samples=len(samples),
                         differences=tuple((d.key, d.why) for d in differences))


def _write_table(opened: OpenedJob) -> tuple[int | None, str | None]:
    """A table OUTPUT made from its records file, finished or not (table_output.py)."""
    tables = opened.tables
    if tables.kind is None:
        return None, None
    try:
        return tables.write_table(opened.spec.order), None
    except JobFileError as exc:
        return None, str(exc)


def _fatal_error(opened: OpenedJob, run: BatchLoop, writer: RecordWriter) -> str | None:
    """What ended the job early, in the order the CLI reports them."""
    cluster = opened.cluster
    if cluster is not None and cluster.fatal_error is not None:
        return str(cluster.fatal_error)
    if writer.error is not None:
        return writer.error
    if opened.engine.fatal_error is not None:  # the engine process died and could not be restarted
        return str(opened.engine.fatal_error)
    return run.read_error


def _report(opened: OpenedJob, run: BatchLoop, writer: RecordWriter, stops: StopRequests, interrupted: bool,
            verify: VerifyOutcome | None, table_rows: int | None, table_error: str | None) -> JobReport:
    s, spec, cluster = writer.stats, opened.spec, opened.cluster
    records = opened.tables.records_output
    manifest = manifest_path(records) if opened.files.on_file else None
    error = _fatal_error(opened, run, writer) or table_error
    return JobReport(
        ok=s.ok, failed=s.failed, lines=run.admitted + run.skipped, output=spec.output if spec.output != "-" else None,
        manifest=manifest, error_file=spec.error_file, cancelled=stops.level > 0 and not interrupted,
        interrupted=interrupted, elapsed_s=run.clock.elapsed(), already_answered=run.skipped,
        not_written=writer.not_written, not_started=writer.unstarted, abandoned=run.abandoned, unit=run.unit,
        error=error, output_failed=writer.error is not None,
        records_output=records,
        table_rows=table_rows, table_error=table_error,
        tokens=Tokens(s.prompt_tokens, s.cached_tokens, s.restored_tokens, s.completion_tokens,
                      dict(s.grammar_backends), s.forced_tokens, s.accepted_prediction_tokens,
                      s.rejected_prediction_tokens, s.preempted, s.paused_ms / 1000),
        restarts=run.restarts, hangs=opened.engine.hangs if cluster is None else 0, isolated=tuple(run.isolated),
        read_note=run.read_note, cluster_summary=tuple(cluster.summary_lines()) if cluster else (),
        verify=verify, stopped=run.stopping)
