"""Opening a job, in the caller's thread, in the order that makes a mistake cheap: settings,
then INPUT, OUTPUT and the files beside it (lock, manifest check, error file, read back on
resume), then the engine (the model loads last: a typo costs nothing). Whatever fails undoes
what was opened before it: no OUTPUT is left behind by a job that never started.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..errors import InvalidRequest
from ..models.default_model import why as model_why
from ..engines import EngineFactory, open_engine
from ..settings.ready import prepare
from ..settings.context_sizing import model_facts
from .reading.context_fit import fit_context
from ..settings.resolved import Resolved
from ..settings.slots import most_slots
from ..settings.time_bounds import TimeBounds
from .events import JobEvent, Notice, Started
from .reading.input_source import count_lines, open_input
from ..openai_format import LineParser
from .on_ray import open_ray_engines, require_ray
from .writing.output_sink import Sink, refuse_resume_to_stream
from .resume.resumable_output import ResumableOutput
from .job_spec import JobHost, JobSpec
from .tables.table_plan import TablePlan, plan_tables
from .writing.written_files import refuse_own_file
from .reading.input_source import Source
from .resume.id_sets import Answered
from .tables.table_input import TableParser, TableSource
from ..openai_format import LineRequest

if TYPE_CHECKING:
    from ..api import EngineAPI
    from ..cluster.pool import RayPool  # imports ray: only where a job runs on Ray


@dataclass
class OpenedJob:
    """Everything a job runs with once it is open (job_running.py runs it)."""

    spec: JobSpec
    resolved: Resolved
    host: JobHost
    tables: TablePlan
    parser: LineParser | TableParser  # a table INPUT's rows are read as lines by its own parser
    files: ResumableOutput  # OUTPUT (its sink) and the files beside it
    source: Source | TableSource
    bounds: TimeBounds
    engine: EngineAPI | None = None  # None until open_engine (the settings are checked first)
    cluster: RayPool | None = None  # run on Ray: the pool (also the engine)
    owns_engine: bool = True  # the job closes it at the end (not a shared engine)
    answered: Answered | None = None  # resume: what OUTPUT already answers
    inflight: int = 1
    reorder_window: int = 1
    start_last: Callable[[LineRequest], bool] | None = None  # lines the run starts after the others (context_fit.py)
    early_events: list[JobEvent] = field(default_factory=list)  # told before the Job could take them
    publish: Callable[[JobEvent], None] | None = None  # the Job's queue, once it exists

    def tell(self, event: JobEvent) -> None:
        (self.publish or self.early_events.append)(event)

    @property
    def sink(self) -> Sink:
        """OUTPUT, as the job's files opened it."""
        return self.files.sink


def format_for_path(path: str) -> str:
    """The input format a file's name implies; "auto" lets its first line decide."""
    name = path.lower()
    if name.endswith(".txt"):
        return "text"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"  # a line that is not JSON there is damage, not a prompt
    return "auto"


def line_parser(spec: JobSpec, resolved: Resolved, tables: TablePlan) -> LineParser | TableParser:
    if tables.reads_table:
        return tables.parser
    fmt = format_for_path(spec.input) if spec.input_format == "auto" else spec.input_format
    return LineParser(resolved.sampling, input_format=fmt, system=spec.system, echo=spec.echo, embed=spec.embed)


def checked_tables(spec: JobSpec, resolved: Resolved) -> TablePlan:
    """The resume checks, then the table plan (docs/tables.md): nothing opened yet before them."""
    if spec.resume and spec.output in (None, "-"):
        raise InvalidRequest("--resume reads back OUTPUT: give it with -o FILE")
    if spec.resume:
        refuse_resume_to_stream(spec.output)
    if spec.logprobs is not None:
        resolved.sampling = dataclasses.replace(resolved.sampling, logprobs=spec.logprobs)
    # INPUT a table, or OUTPUT one: checked and opened before the model loads (table_plan.py)
    return plan_tables(spec, resolved.sampling)


def open_job(spec: JobSpec, resolved: Resolved, host: JobHost, engine: "EngineAPI | None" = None) -> OpenedJob:
    """Open everything, or raise (typed) with nothing left open."""
    if spec.ray is not None:
        require_ray()  # no Ray: one line before anything opens
    bounds = spec.bounds
    tables = checked_tables(spec, resolved)
    try:
        parser = line_parser(spec, resolved, tables)
        if spec.error_file is not None:  # never one of the job's own files, however spelled (written_files.py)
            refuse_own_file(spec.error_file, tables.output, tables.records_output, spec.input)
        opened = _open_files(spec, resolved, host, tables, parser, bounds)
    except BaseException:
        tables.close()
        raise
    try:
        _open_engine(opened, engine)
    except BaseException:
        opened.files.discard()
        _close_input(opened)
        raise
    _begin(opened)
    return opened


def _open_files(spec: JobSpec, resolved: Resolved, host: JobHost, tables: TablePlan, parser: LineParser | TableParser,
                bounds: TimeBounds) -> OpenedJob:
    early: list[JobEvent] = []
    files = ResumableOutput(resolved, spec.input, tables.records_output, error_file=spec.error_file,
                            resume=spec.resume, retry_failed=spec.retry_failed,
                            allow_changed=spec.allow_changed_settings, system=spec.system, argv=host.argv,
                            tell=lambda line: early.append(Notice(line, always=True)), table=tables.identity)
    try:
        files.prepare()
        source = tables.source if tables.reads_table else open_input(spec.input, host.stdin)
    except BaseException:
        files.release()
        raise
    opened = OpenedJob(spec, resolved, host, tables, parser, files, source, bounds, early_events=early)
    files.tell = lambda line: opened.tell(Notice(line, always=True))
    try:
        files.open_files(host.stdout)
        if spec.resume:
            opened.answered, torn = files.read_back()
            early.append(Notice(f"resuming: {opened.answered.records} record(s) already in {tables.records_output}"
                                + (f"; cut off a torn last line ({torn} bytes)" if torn else "")))
    except BaseException:
        files.discard()
        if not tables.reads_table:
            source.close()
        raise
    return opened


def _open_engine(opened: OpenedJob, engine: "EngineAPI | None") -> None:
    """The shared engine, or the job's own (auto never opens more slots than lines, locally
    and on each Ray worker); how many lines run at once and are read ahead."""
    spec, host = opened.spec, opened.host
    if engine is not None:
        opened.engine, opened.owns_engine = engine, False
        opened.cluster = getattr(engine, "cluster", None)  # a shared engine over Ray workers (serve --ray)
    else:
        cap = most_slots(opened.resolved.engine) + 1
        lines = count_lines(opened.source, cap) if opened.source.is_file else opened.tables.rows_up_to(cap)
        if spec.ray is None:
            if opened.source.is_file:
                _fit_context(opened)
            opened.engine = open_engine(opened.resolved, factory=host.engine_factory, max_slots=lines,
                                        isolated=spec.isolate, watchdog_s=opened.bounds.watchdog_s,
                                        on_notice=host.tell or (lambda line: opened.tell(Notice(line, always=True))))
        else:
            note = (lambda line: opened.tell(Notice(line.removeprefix("llamabatch run: "))))
            opened.engine = opened.cluster = open_ray_engines(opened.resolved, spec, note=note, max_slots=lines,
                                                              watchdog_s=opened.bounds.watchdog_s, host=host)
    # At most this many lines in the engine(s): enough queued behind every slot to keep it busy.
    held = opened.cluster.inflight_cap if opened.cluster else 4 * opened.engine.config.n_parallel
    opened.inflight = spec.max_inflight or held
    # as many lines to choose from as the engine(s) hold at once by default
    opened.reorder_window = spec.reorder_window if spec.reorder_window is not None else held


def _fit_context(opened: OpenedJob) -> None:
    """n_ctx auto: the KV cache sized from INPUT's longest lines (context_fit.py)."""
    host = opened.host
    factory = host.engine_factory or EngineFactory()
    opened.resolved, _plan, long_lines = fit_context(
        opened.resolved, opened.source.name, opened.parser,
        # the memory fit is the engine's own prepare's, for the slots this leaves unplanned
        prepare=lambda resolved, lines: prepare(resolved, lines, factory.choose_slots, fit_memory=False),
        open_tokenizer=lambda resolved: open_engine(resolved, factory=host.engine_factory,
                                                    on_notice=host.tell or (lambda line: None)),
        model_facts=lambda resolved: model_facts(resolved.engine, resolved.engine.model))
    if long_lines:
        opened.start_last = lambda item: item.line_no in long_lines


def _close_input(opened: OpenedJob) -> None:
    if not opened.tables.reads_table:  # a table's source is the plan's to close
        opened.source.close()
    opened.tables.close()


def _begin(opened: OpenedJob) -> None:
    """OUTPUT emptied (a job without resume replaces it) and the manifest's start written,
    before any record; the Started event."""
    engine, files = opened.engine, opened.files
    try:
        files.begin(engine.model_name)
    except BaseException:
        files.discard(keep_output=True)
        if opened.owns_engine:
            engine.close()
        _close_input(opened)
        raise
    if opened.tables.empty_note:
        opened.tell(Notice(opened.tables.empty_note))
    cluster = opened.cluster
    opened.tell(Started(
        model=engine.model_name, why_model=model_why(opened.resolved.sources.get("model")) if opened.owns_engine else "",
        n_parallel=engine.config.n_parallel, slot_ctx=engine.slot_ctx, slots_reason=engine.slots_reason,
        kernels=engine.kernels, cluster=cluster.describe() if cluster else None, input=opened.spec.input,
        output=opened.spec.output if opened.spec.output != "-" else None,
        layout_reason=opened.resolved.layout_reason if opened.owns_engine else ""))
