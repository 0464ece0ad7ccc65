"""`llamabatch run INPUT [-o OUTPUT]`: every line of a prompts file through the engine.

This module is the command line around the pieces beside it: line shapes in formats.py,
files in files.py, the reader/callback loop in batch.py, the writer in writer.py,
progress in progress.py.
"""
from __future__ import annotations

import dataclasses
import shlex
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

import typer

from .formats import LineParser
from ...llama import autoslots
from ...models.default_model import why as model_why
from ..common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, fail, open_engine, resolve_options
from .verify import Reservoir, rerun_alone
from ..env import Environment
from ..options import SharedOptions, with_shared_options
from .progress import Reporter, clock_duration, make_reporter
from .batch import BatchRun, Interrupts, wait_for
from .files import (LineCounter, RunFileError, Sink, Source, count_lines, open_input, open_output, refuse_resume_to_stream, stream_kind)
from .on_ray import import_ray_pool, open_pool
from ..time_bounds import DRAIN_HELP, WATCHDOG_HELP, time_bounds
from .writer import RecordWriter
from .long_job import LongJob
from .own_files import refuse_own_file
from .table_plan import TablePlan, plan_tables
from .table_input import TableOptions

# Finished lines that may wait behind a slow one in --order input, per --max-inflight.
REORDER_WINDOW_FACTOR = 8


class Order(str, Enum):
    input = "input"
    completion = "completion"


class InputFormat(str, Enum):
    auto = "auto"
    text = "text"
    jsonl = "jsonl"


class CsvFormulas(str, Enum):
    escape = "escape"
    raw = "raw"


@dataclass(frozen=True)
class RunOptions:
    """`run`'s own options (the shared ones are in the Resolved settings), as given."""

    input_path: str
    output: str | None = None
    input_format: str = "auto"
    system: str | None = None
    order: str | None = None  # None: the config file's [run] order, else "input" (_with_config_keys)
    max_inflight: int | None = None
    reorder_window: int | None = None
    resume: bool = False
    echo: bool = False
    embed: bool = False
    fail_on_error: bool = False
    isolate: bool = True
    watchdog: float | None = None
    drain_timeout: float | None = None
    quiet: bool = False
    progress_every: float = 10.0
    ray: str | None = None
    ray_workers: int | None = None
    ray_cpus_per_worker: int | None = None
    ray_gpus_per_worker: float | None = None
    verify: int | None = None
    dry_run: bool = False  # long jobs (docs/long-jobs.md)
    as_json: bool = False
    error_file: str | None = None
    retry_failed: bool = False
    allow_changed_settings: bool = False
    tables: TableOptions = TableOptions()  # docs/tables.md
    logprobs: int | None = None


@dataclass
class RunJob:
    """Everything the batch loop (`_run`) works with once the files are open and the
    engine is built: what used to be its 15 positional parameters."""

    parser: LineParser
    source: Source
    sink: Sink
    reporter: Reporter
    options: RunOptions
    inflight: int
    argv: tuple[str, ...]  # the command line as typed, for the resume hint
    reorder_window: int = 1  # lines read ahead to choose the next line to start from (start_order.py)
    answered: Any = None  # with --resume: what OUTPUT already answers
    cluster: Any = None  # with --ray: the RayPool (also the engine)
    deterministic: bool = False
    drain_timeout: float | None = None
    route: Any = None  # which file each record goes to (--error-file, --retry-failed: error_file.Routes)
    on_end: Any = None  # called with (BatchRun, RecordWriter) once the files are closed (long_job.py)
    counter: Any = None  # the progress total of a table INPUT (table_input.TableCounter)
    model_why: str = ""  # for the header: why this model (models.default_model.why)


@with_shared_options
def run_command(
    # Default-value style, not Annotated: with_shared_options hands Typer a signature whose
    # annotations are still strings (from __future__ import annotations).
    input_path: str = typer.Argument(..., metavar="INPUT", show_default=False,
                                     help="Prompts file (.jsonl, .txt), or - for stdin."),
    output: Optional[str] = typer.Option(None, "--output", "-o", show_default=False,
                                         help="Results file, one JSON line per input line \\[default: stdout]."),
    input_format: InputFormat = typer.Option(InputFormat.auto, "--input-format",
                                             help="auto: .jsonl files are JSON lines, .txt files text; otherwise "
                                                  "the first line decides ({ or [ starts JSON lines). text: every "
                                                  "line is a prompt; jsonl: every line is JSON (one that is not "
                                                  "gets an error record)."),
    system: Optional[str] = typer.Option(None, "--system", show_default=False,
                                         help="System prompt for lines without one (text and prompt lines then "
                                              "run as chat)."),
    order: Optional[Order] = typer.Option(None, "--order", show_default=False,
                                          help="input: records in input order; completion: each as soon as it "
                                               "finishes \\[default: input]."),
    max_inflight: Optional[int] = typer.Option(None, "--max-inflight", min=1, show_default=False,
                                               help="Most lines parsed ahead of the engine \\[default: 4 x n-parallel]."),
    reorder_window: Optional[int] = typer.Option(None, "--reorder-window", min=0, metavar="N", show_default=False,
                                                 help="Lines read ahead to choose the next line to start from: "
                                                      "lines whose prompts share a long prefix start together, so "
                                                      "the prefix is evaluated once (records keep --order). 0 or 1: "
                                                      "start lines in read order \\[default: 4 x n-parallel]."),
    resume: bool = typer.Option(False, "--resume",
                                help="Keep OUTPUT, skip the ids it already answers, append the rest."),
    echo: bool = typer.Option(False, "--echo", help="Copy each line's prompt and extra fields into its record "
                                                    "under \"input\" (plain shape)."),
    embed: bool = typer.Option(False, "--embed", help="Text lines and {\"prompt\"} lines are embeddings inputs "
                                                      "(one vector each) instead of prompts. {\"input\"} lines and "
                                                      "/v1/embeddings lines are embeddings without it."),
    fail_on_error: bool = typer.Option(False, "--fail-on-error", help="Exit 1 if any line failed."),
    isolate: bool = typer.Option(True, "--isolate/--no-isolate",
                                 help="Run llama.cpp in a supervised child process: a crash costs a restart and "
                                      "the line causing it gets an engine_crashed record. --no-isolate: in this "
                                      "process (a crash ends the run)."),
    watchdog: Optional[float] = typer.Option(None, "--watchdog", min=0.0, metavar="SECONDS", show_default=False,
                                             help=WATCHDOG_HELP),
    drain_timeout: Optional[float] = typer.Option(None, "--drain-timeout", min=0.0, metavar="SECONDS",
                                                  show_default=False, help=DRAIN_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no summary on stderr."),
    progress_every: float = typer.Option(10.0, "--progress-every", min=0.0,
                                         help="Seconds between progress lines when stderr is not a terminal."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="[ADDRESS]", show_default=False,
                                      rich_help_panel="Ray",
                                      help="Run on Ray, one engine per worker. Alone: start a local Ray "
                                           "instance; auto, HOST:PORT or ray://HOST:PORT: join that cluster."),
    ray_workers: Optional[int] = typer.Option(None, "--ray-workers", min=1, show_default=False,
                                              rich_help_panel="Ray",
                                              help="Engines \\[default: one per node that has the CPUs]."),
    ray_cpus_per_worker: Optional[int] = typer.Option(None, "--ray-cpus-per-worker", min=1, show_default=False,
                                                      rich_help_panel="Ray",
                                                      help="CPUs per engine, also its llama.cpp threads "
                                                           "\\[default: all CPUs of a node, shared by its engines]."),
    ray_gpus_per_worker: Optional[float] = typer.Option(None, "--ray-gpus-per-worker", min=0.0,
                                                        show_default=False, rich_help_panel="Ray",
                                                        help="GPUs per engine (CUDA builds; with --n-gpu-layers)."),
    verify: Optional[int] = typer.Option(None, "--verify", min=1, metavar="N", show_default=False,
                                         help="After the run, re-run N randomly sampled lines one at a time and "
                                              "compare tokens (e.g. --verify 8); exit 1 if any differ. Meant for "
                                              "--deterministic."),
    dry_run: bool = typer.Option(False, "--dry-run", rich_help_panel="Long jobs",
                                 help="Read, check and tokenize every line and print what the run would "
                                      "cost (tokens, an ETA from the auto calibration); generate nothing, "
                                      "write no OUTPUT. With --resume: what is left to run."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel="Long jobs",
                                 help="With --dry-run: the estimate as one JSON object on stdout."),
    error_file: Optional[str] = typer.Option(None, "--error-file", metavar="PATH", show_default=False,
                                             rich_help_panel="Long jobs",
                                             help="Failed lines' records go to PATH instead of OUTPUT (the same "
                                                  "shape; OpenAI's error file for OpenAI Batch lines)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", rich_help_panel="Long jobs",
                                      help="With --resume: run again the lines whose record is a retryable error "
                                           "(timeout, engine_crashed, engine_unavailable, engine_error, "
                                           "decode_error, queue_full, engine_closed); the new record replaces "
                                           "the old one."),
    allow_changed_settings: bool = typer.Option(False, "--allow-changed-settings", rich_help_panel="Long jobs",
                                                help="Resume although the settings that change answers differ "
                                                     "from the manifest's (or it is missing); the change is "
                                                     "recorded in the manifest's history."),
    template: Optional[str] = typer.Option(None, "--template", metavar="TEXT", show_default=False,
                                           rich_help_panel="Tables",
                                           help="Table INPUT: the prompt of each row, a Python str.format template "
                                                "whose fields are column names, e.g. 'Classify the sentiment: "
                                                "{review}' \\[default: the prompt column, if there is one]."),
    template_file: Optional[str] = typer.Option(None, "--template-file", metavar="PATH", show_default=False,
                                                rich_help_panel="Tables",
                                                help="Table INPUT: read the --template from PATH (one final "
                                                     "newline dropped)."),
    messages_template: Optional[str] = typer.Option(None, "--messages-template", metavar="PATH",
                                                    show_default=False, rich_help_panel="Tables",
                                                    help="Table INPUT: a JSON list of chat messages whose "
                                                         "contents are templates, e.g. [{\"role\": \"user\", "
                                                         "\"content\": \"Translate: {text}\"}]."),
    id_column: Optional[str] = typer.Option(None, "--id-column", metavar="COLUMN", show_default=False,
                                            rich_help_panel="Tables",
                                            help="Table INPUT: the column holding each row's id \\[default: the "
                                                 "row number, 1 for the first data row]."),
    embed_column: Optional[str] = typer.Option(None, "--embed-column", metavar="COLUMN", show_default=False,
                                               rich_help_panel="Tables",
                                               help="Table INPUT: embed this column of every row (one vector "
                                                    "each, in the response column as JSON) instead of generating; "
                                                    "--embed with --template embeds the rendered text."),
    keep_columns: Optional[str] = typer.Option(None, "--keep-columns", metavar="A,B|all", show_default=False,
                                               rich_help_panel="Tables",
                                               help="Table INPUT: input columns copied into each result (a table "
                                                    "OUTPUT's columns; a JSONL record's \"input\")."),
    delimiter: Optional[str] = typer.Option(None, "--delimiter", metavar="CHAR", show_default=False,
                                            rich_help_panel="Tables",
                                            help="Read INPUT as delimited text with this one-character "
                                                 "delimiter (\\t for tab) \\[default: , for .csv, tab for .tsv]."),
    csv_formulas: CsvFormulas = typer.Option(CsvFormulas.escape, "--csv-formulas", rich_help_panel="Tables",
                                             help="A CSV/TSV OUTPUT's text cells that begin with =, +, -, @, tab "
                                                  "or carriage return: escape writes them with a leading ' so a "
                                                  "spreadsheet shows text rather than running a formula (OWASP's "
                                                  "advice; plain numbers are left alone); raw writes them as they "
                                                  "are."),
    logprobs: Optional[int] = typer.Option(None, "--logprobs", min=0, max=20, metavar="K", show_default=False,
                                           rich_help_panel="Tables",
                                           help="Log probabilities of each generated token with its top K "
                                                "alternatives (0: the chosen token's only), for lines that do "
                                                "not ask themselves; a table OUTPUT gets a logprobs column "
                                                "(JSON text)."),
    *,
    opts: SharedOptions,
    env: Environment,
) -> None:
    """Run every prompt in INPUT concurrently and write one JSON line per input line.

    Lines: a text prompt, {"prompt": ...}, {"messages": [...]}, {"input": ...} (embeddings), or an
    OpenAI Batch request {"custom_id", "method": "POST", "url": "/v1/chat/completions",
    "/v1/completions" or "/v1/embeddings", "body"}.
    JSON lines may set "id" and any sampling field (max_tokens, temperature, stop, seed, ...);
    flags set the defaults they override.

    Records: OpenAI Batch lines get the OpenAI Batch output shape; others get {"id", "text",
    "finish_reason", "usage", "timings", "seed", "error"}. A bad line gets an error record and
    the run goes on.

    Crash-safe: each record is flushed when written. After an interruption or a crash, run
    the same command with --resume to finish the rest.

    Tables: INPUT may be .csv, .tsv, .parquet, .arrow, .feather, a folder of Parquet shards
    or hf:datasets/OWNER/NAME\\[/CONFIG][:SPLIT] (rows through --template); -o *.csv, *.tsv,
    *.parquet, *.sqlite or *.db writes a table (docs/tables.md).
    """
    run(RunOptions(input_path=input_path, output=output, input_format=input_format.value, system=system,
                   order=order.value if order is not None else None, max_inflight=max_inflight, reorder_window=reorder_window, resume=resume,
                   echo=echo, embed=embed, fail_on_error=fail_on_error, isolate=isolate, watchdog=watchdog, drain_timeout=drain_timeout,
                   quiet=quiet, progress_every=progress_every, ray=ray, ray_workers=ray_workers,
                   ray_cpus_per_worker=ray_cpus_per_worker, ray_gpus_per_worker=ray_gpus_per_worker,
                   verify=verify, dry_run=dry_run, as_json=as_json, error_file=error_file,
                   retry_failed=retry_failed, allow_changed_settings=allow_changed_settings,
                   tables=TableOptions(template=template, template_file=template_file,
                                       messages_template=messages_template, id_column=id_column,
                                       keep_columns=keep_columns, delimiter=delimiter,
                                       embed_column=embed_column, csv_formulas=csv_formulas.value),
                   logprobs=logprobs),
        opts, env)


CONFIG_KEYS = ("order", "max_inflight", "reorder_window", "error_file")  # run's own keys in [run]


def _with_config_keys(o: RunOptions, env: Environment) -> RunOptions:
    """`o` with run's own keys read from the config file's [run] table where no flag set them
    (a flag wins; docs/config.md), once, before anything reads them; order defaults to input."""
    from ...settings.file_layer import command_setting

    found = {key: command_setting("run", key, None, env.config_path) for key in CONFIG_KEYS if getattr(o, key) is None}
    o = dataclasses.replace(o, **{key: value for key, value in found.items() if value is not None})
    return o if o.order is not None else dataclasses.replace(o, order="input")


def run(o: RunOptions, opts: SharedOptions, env: Environment) -> None:
    """The command's body: `o` its own options, `opts` the shared ones, `env` where it runs."""
    o = _with_config_keys(o, env)
    ray_pool = import_ray_pool(o.ray) if o.ray is not None else None  # no Ray: exit 2 before anything
    resolved = resolve_options(opts, env)
    bounds = time_bounds("run", o.watchdog, o.drain_timeout, env.config_path)
    if o.resume and o.output in (None, "-"):
        raise fail("--resume reads back OUTPUT: give it with -o FILE", EXIT_USAGE)
    if o.resume:
        try:
            refuse_resume_to_stream(o.output)
        except RunFileError as exc:
            raise fail(str(exc), EXIT_USAGE) from None
    if o.logprobs is not None:
        resolved.sampling = dataclasses.replace(resolved.sampling, logprobs=o.logprobs)
    # INPUT a table, or OUTPUT one: checked and opened before the model loads (table_plan.py)
    tables = plan_tables(o, resolved.sampling)
    fmt = o.input_format
    if fmt == "auto":
        fmt = format_for_path(o.input_path)
    parser = tables.parser if tables.reads_table else LineParser(resolved.sampling, input_format=fmt,
                                                                 system=o.system, echo=o.echo,
                                                                 embed=o.embed)
    try:
        _prepared(o, resolved, parser, tables, bounds, ray_pool, env)
    finally:
        tables.close()


def _prepared(o: RunOptions, resolved, parser, tables: TablePlan, bounds, ray_pool, env: Environment) -> None:
    error_file = o.error_file
    if error_file is not None:  # never one of the run's own files, however spelled (own_files.py)
        refuse_own_file(error_file, tables.output, tables.records_output, o.input_path)
    if o.as_json and not o.dry_run:
        raise fail("--json goes with --dry-run (the records are JSON already; `llamabatch report OUTPUT --json` "
                   "prints the manifest)", EXIT_USAGE)
    if o.dry_run:
        from .dry_run import dry_run_command

        raise typer.Exit(dry_run_command(resolved, parser, o.input_path, tables.records_output, resume=o.resume,
                                         retry_failed=o.retry_failed, error_file=error_file, as_json=o.as_json,
                                         stdin=env.stdin, write=env.out,
                                         open_tokenizer=lambda r: open_engine(r, env, isolated=False),
                                         table_source=tables.source,
                                         table_rows=tables.rows_up_to(1 << 62) if tables.reads_table else None))
    job = LongJob(resolved, o.input_path, tables.records_output, error_file=error_file, resume=o.resume,
                  retry_failed=o.retry_failed, allow_changed=o.allow_changed_settings, system=o.system,
                  argv=env.argv, say=env.say, table=tables.identity)
    try:
        job.prepare()
        _run_job(job, o, resolved, parser, bounds, ray_pool, env, tables)
    finally:
        job.release()


def _run_job(job: LongJob, o: RunOptions, resolved, parser: LineParser, bounds, ray_pool, env: Environment,
             tables: TablePlan) -> None:
    # INPUT and OUTPUT are checked before the model loads: a typo costs nothing.
    try:
        source = tables.source if tables.reads_table else open_input(o.input_path, env.stdin)
        sink = open_output(tables.records_output, o.input_path, env.stdout)
    except RunFileError as exc:
        raise fail(str(exc), EXIT_ERROR) from None
    try:
        job.open_files()
    except BaseException:
        sink.discard()
        raise
    answered = None
    if o.resume:
        try:
            answered, torn = job.read_back(sink)
        except RunFileError as exc:
            sink.discard()
            job.discard()
            raise fail(str(exc), EXIT_ERROR) from None
    try:  # Ctrl-C while the model loads: exit 130 (app.main), no traceback, no OUTPUT left
        # auto never opens more slots than lines (locally, and on each Ray worker)
        cap = max(autoslots.CANDIDATES) + 1
        lines = count_lines(source, cap) if source.is_file else tables.rows_up_to(cap)
        if ray_pool is None:
            engine = open_engine(resolved, env, max_slots=lines, isolated=o.isolate, watchdog_s=bounds.watchdog_s)
            cluster = None
        else:
            engine = cluster = open_pool(ray_pool, resolved, o.ray, o.ray_workers, o.ray_cpus_per_worker,
                                         o.ray_gpus_per_worker, note=(lambda _m: None) if o.quiet else env.say,
                                         max_slots=lines, watchdog_s=bounds.watchdog_s, debug=env.debug)
    except BaseException:
        sink.discard()
        job.discard()
        raise
    # At most this many lines in the engine(s): enough queued behind every slot to keep it busy.
    inflight = o.max_inflight or (cluster.inflight_cap if cluster else 4 * engine.config.n_parallel)
    reorder_window = o.reorder_window
    if reorder_window is None:  # as many lines to choose from as the engine(s) hold at once by default
        reorder_window = cluster.inflight_cap if cluster else 4 * engine.config.n_parallel
    reporter = make_reporter(o.quiet, o.progress_every, env.stderr, live_ok=not sink.is_terminal,
                             stream_isatty=env.stderr_isatty)
    if tables.empty_note:
        reporter.note(tables.empty_note)
    if o.resume:
        reporter.note(f"llamabatch run: resuming: {answered.records} record(s) already in {tables.records_output}"
                      + (f"; cut off a torn last line ({torn} bytes)" if torn else ""))
    finished: list[bool] = []  # whether every INPUT entry got its record (set when the loop ends)
    try:
        if not o.resume:
            try:
                sink.start_fresh()
                job.start_fresh()
            except RunFileError as exc:
                raise fail(str(exc), EXIT_ERROR) from None
        try:
            job.begin(engine.model_name)
        except BaseException:
            sink.close()
            job.discard()
            raise

        def ended(run: BatchRun, writer: RecordWriter) -> None:
            complete = not run.stopping and run.read_error is None and writer.error is None
            finished.append(complete)
            job.end(complete=complete, wall_s=run.elapsed(), written=writer.stats.written,
                    generated=writer.stats.completion_tokens, ray=cluster.describe() if cluster else None,
                    input_ids=run.seen_ids if complete else None)

        code = _run(engine, RunJob(parser=parser, source=source, sink=sink, reporter=reporter, options=o,
                                   inflight=inflight, reorder_window=reorder_window, argv=env.argv,
                                   answered=answered, cluster=cluster,
                                   deterministic=resolved.engine.deterministic,
                                   model_why=model_why(resolved.sources.get("model")),
                                   drain_timeout=bounds.drain_timeout_s, route=job.routes(sink), on_end=ended,
                                   counter=tables.counter()))
    finally:
        engine.close()
        source.close()
    if tables.kind is not None:  # the table from the records file, finished or not (table_output.py)
        code = tables.finalize(code, o.order, complete=bool(finished and finished[0]), quiet=o.quiet,
                               say=env.say)
    raise typer.Exit(code)


def format_for_path(path: str) -> str:
    """The input format a file's name implies; "auto" lets its first line decide."""
    name = path.lower()
    if name.endswith(".txt"):
        return "text"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"  # a line that is not JSON there is damage, not a prompt
    return "auto"


def _run(engine, job: RunJob) -> int:
    """`engine` is an Engine, or with --ray the RayPool (`job.cluster` too), which takes lines the same way."""
    parser, source, sink, reporter, cluster = job.parser, job.source, job.sink, job.reporter, job.cluster
    input_path, output, order, argv = job.options.input_path, job.options.output, job.options.order, job.argv
    inflight, deterministic = job.inflight, job.deterministic
    why = f" ({engine.slots_reason})" if engine.slots_reason else ""
    kernels = f", {engine.kernels}" if engine.kernels else ""
    model = f"{engine.model_name} ({job.model_why})" if job.model_why else engine.model_name
    what = cluster.describe() if cluster else (f"{model}, {engine.config.n_parallel} slots x "
                                               f"{engine.slot_ctx} tokens{why}{kernels}")
    reporter.note(f"llamabatch run: {what}, {input_path} -> {output or 'stdout'}")
    resumable = sink.is_regular_file  # asked now: the sink is closed before the end is told
    # Admitted lines not yet written: those in the engine, those waiting to start (reorder
    # window), and in input order the finished ones waiting behind a slow one.
    waiting = max(1, job.reorder_window)
    window = threading.Semaphore((inflight * REORDER_WINDOW_FACTOR if order == "input" else inflight) + waiting)
    writer = RecordWriter(sink, engine.model_name, order, window, deterministic=deterministic, route=job.route)
    reservoir = Reservoir(job.options.verify) if job.options.verify else None
    run = BatchRun(engine, parser, source, writer, window, max_inflight=inflight, answered=job.answered,
                   reorder_window=job.reorder_window,
                   # a Ray worker holds 2 x its slots (cluster/pool.py): the pool's slots, near enough
                   slots=max(1, cluster.inflight_cap // 2) if cluster else engine.config.n_parallel,
                   on_result=(lambda item, result: reservoir.offer(item.id, item.prompt, item.params, result))
                   if reservoir else None)
    counter = LineCounter(source.name) if source.is_file else job.counter
    interrupts = Interrupts()
    try:
        with interrupts.installed():
            run.start()
            wait_for(run, reporter, interrupts, counter, cluster, drain_timeout=job.drain_timeout)
    finally:
        reporter.close()
        writer.close()
        sink.close()
        if job.on_end is not None:  # the manifest's end, the --retry-failed merge (long_job.py)
            job.on_end(run, writer)
    _summary(reporter, run, writer, restarts_told=cluster is not None)  # the pool tells its workers' restarts
    if cluster is not None:
        for line in cluster.summary_lines():
            reporter.note(line)
        if cluster.fatal_error is not None:
            reporter.say(f"llamabatch: error: {cluster.fatal_error}")
            reporter.say(_resume_hint(writer.stats.written, input_path, output, argv))
            return EXIT_ERROR
    if run.read_note is not None:
        reporter.say(f"llamabatch run: {run.read_note}")
    if writer.error is not None:
        reporter.say(f"llamabatch: error: {writer.error}")
        if resumable:  # every record in it is whole (a torn last one is cut on resume)
            reporter.say(_resume_hint(writer.stats.written, input_path, output, argv))
        return EXIT_ERROR
    fatal = engine.fatal_error
    if fatal is not None:  # the engine process died and could not be restarted
        reporter.say(f"llamabatch: error: {fatal}")
        reporter.say(_resume_hint(writer.stats.written, input_path, output, argv))
        return EXIT_ERROR
    if run.read_error is not None:
        reporter.say(f"llamabatch: error: {run.read_error}")
        reporter.say(_resume_hint(writer.stats.written, input_path, output, argv))
        return EXIT_ERROR
    if run.stopping:
        reporter.say(_resume_hint(writer.stats.written, input_path, output, argv))
        return 128 + interrupts.first if interrupts.first else EXIT_INTERRUPTED
    if reservoir is not None and not _verified(engine, reservoir, reporter, deterministic):
        return EXIT_ERROR
    if job.options.fail_on_error and writer.stats.failed:
        return EXIT_ERROR
    return EXIT_OK


def _verified(engine, reservoir: Reservoir, reporter: Reporter, deterministic: bool) -> bool:
    """--verify: re-run the sampled lines alone; say what came out (always, even with -q)."""
    samples = reservoir.samples
    if not samples:
        reporter.say("llamabatch run: verify: no finished line to re-run")
        return True
    reporter.note(f"llamabatch run: verify: re-running {len(samples)} of {reservoir.seen} finished line(s) "
                  "one at a time")
    differences = rerun_alone(engine, samples)
    if not differences:
        reporter.say(f"llamabatch run: verified {len(samples)}/{len(samples)} identical")
        return True
    reporter.say(f"llamabatch run: verify: {len(differences)} of {len(samples)} differ: "
                 + ", ".join(repr(d.key) for d in differences))
    for d in differences:
        reporter.say(f"llamabatch run: verify: id {d.key!r}: {d.why}")
    if not deterministic:
        reporter.say("llamabatch run: verify: without --deterministic, output may depend on the batch")
    return False


def _summary(reporter: Reporter, run: BatchRun, writer: RecordWriter, restarts_told: bool = False) -> None:
    s = writer.stats
    wall = run.elapsed()
    line = f"llamabatch run: {s.written} {run.unit}(s) in {clock_duration(wall)}: {s.ok} ok, {s.failed} failed"
    if run.skipped:
        line += f"; {run.skipped} already in OUTPUT"
    if writer.skipped:
        stuck = f"; {run.abandoned} of them still running when the drain time ran out" if run.abandoned else ""
        line += f"; {writer.skipped} cancelled (not written{stuck})"
    reporter.note(line)
    if run.restarts and not restarts_told:
        isolated = ", ".join(repr(i) for i in run.isolated) or "none"
        hangs = run.engine.hangs
        hung = f" ({hangs} of them hung: killed by the watchdog)" if hangs else ""
        reporter.note(f"llamabatch run: the engine process crashed and was restarted {run.restarts} time(s){hung}; "
                      f"isolated: {isolated}")
    share = f"{100 * s.cached_tokens / s.prompt_tokens:.0f}%" if s.prompt_tokens else "0%"
    disk = f"; {s.restored_tokens} of them from the disk prefix store" if s.restored_tokens else ""
    reporter.note(f"llamabatch run: prompt tokens {s.prompt_tokens} ({s.cached_tokens} cached, {share}{disk}), "
                  f"generated {s.completion_tokens}, {wall:.1f}s wall, "
                  f"{s.completion_tokens / wall if wall > 0 else 0:.1f} generated tok/s")
    guessed = s.accepted_prediction_tokens + s.rejected_prediction_tokens
    if guessed:  # speculative decoding (docs/speculative.md)
        reporter.note(f"llamabatch run: speculative decoding: {s.accepted_prediction_tokens} of {guessed} guessed "
                      f"token(s) kept ({100 * s.accepted_prediction_tokens / guessed:.0f}%), "
                      f"{100 * s.accepted_prediction_tokens / max(s.completion_tokens, 1):.0f}% of the generated")
    if s.grammar_backends:  # which backend constrained the structured lines (docs/structured-output.md)
        ways = {"llguidance": "as llguidance token masks", "llama": "through llama.cpp's grammar sampler"}
        parts = ", ".join(f"{n} line(s) {ways.get(b, b)}" for b, n in sorted(s.grammar_backends.items()))
        reporter.note(f"llamabatch run: structured output: {parts}; {s.forced_tokens} token(s) forced by the grammar")


def _resume_hint(written: int, input_path: str, output: str | None, argv: tuple[str, ...]) -> str:
    if output in (None, "-"):
        return (f"llamabatch run: stopped early; {written} record(s) went to stdout. To finish the rest, "
                f"run again with -o FILE (the file stdout went to) and --resume")
    if stream_kind(output) is not None:  # a pipe or FIFO cannot be read back: the same advice as stdout
        return (f"llamabatch run: stopped early; {written} record(s) went to {output}. To finish the rest, "
                f"run again with -o FILE (the file they were saved to) and --resume")
    args = list(argv)
    if "run" in args:  # the command as typed, with every option kept
        command = shlex.join(["llamabatch", *args] + ([] if "--resume" in args else ["--resume"]))
    else:
        command = shlex.join(["llamabatch", "run", input_path, "-o", output, "--resume"])
    return f"llamabatch run: stopped early; {written} record(s) written to {output} this run. Resume with:\n  {command}"
