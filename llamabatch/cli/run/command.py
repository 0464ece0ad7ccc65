"""`llamabatch run INPUT [-o OUTPUT]`: every line of a prompts file (or row of a table) through
the engine, as a job of llamabatch.jobs: the flags become the job's settings, its events
progress on stderr (job_view.py), its report the last lines and the exit status
(job_summary.py).
"""
from __future__ import annotations

import json
from enum import Enum
from typing import Any, Optional

import typer

from ..exit_status import EXIT_OK, EXIT_USAGE, fail
from ..env import Environment
from ..engine_options import EngineOptions, with_engine_options
from ..time_bound_flags import DRAIN_HELP, WATCHDOG_HELP


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


@with_engine_options
def run_command(
    # Default-value style, not Annotated: with_engine_options hands Typer a signature whose
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
    opts: EngineOptions,
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
    own = dict(input_format=input_format.value, system=system, order=order.value if order is not None else None,
               max_inflight=max_inflight, reorder_window=reorder_window, resume=resume, echo=echo, embed=embed,
               fail_on_error=fail_on_error, isolate=isolate, watchdog=watchdog, drain_timeout=drain_timeout, ray=ray,
               ray_workers=ray_workers, ray_cpus_per_worker=ray_cpus_per_worker,
               ray_gpus_per_worker=ray_gpus_per_worker, verify=verify, error_file=error_file,
               retry_failed=retry_failed, allow_changed_settings=allow_changed_settings, template=template,
               template_file=template_file, messages_template=messages_template, id_column=id_column,
               keep_columns=keep_columns, delimiter=delimiter, embed_column=embed_column,
               csv_formulas=csv_formulas.value, logprobs=logprobs)
    settings = {**opts.values, **{key: value for key, value in own.items() if value is not None}}
    raise typer.Exit(run(input_path, output, settings, env, quiet=quiet, progress_every=progress_every,
                         dry_run=dry_run, as_json=as_json))


def run(input_path: str, output: str | None, settings: dict[str, Any], env: Environment, *, quiet: bool = False,
        progress_every: float = 10.0, dry_run: bool = False, as_json: bool = False) -> int:
    """The command's body: the job's settings (run's options and the shared ones), then how
    it shows; returns the exit status. Typed errors end it through app.main (exit_code_for)."""
    # The job (and the engine under it) loads when a job runs: `run --help` and completion never do
    from ...jobs import JobHost, estimate_job, start_job
    from .estimate_lines import estimate_lines
    from .job_summary import exit_status
    from .job_view import follow

    if as_json and not dry_run:
        raise fail("--json goes with --dry-run (the records are JSON already; `llamabatch report OUTPUT --json` "
                   "prints the manifest)", EXIT_USAGE)
    host = JobHost(stdin=env.stdin, stdout=env.stdout, config_path=env.config_path, argv=env.argv,
                   engine_factory=env.engine_factory, tell=lambda line: env.say(f"llamabatch: {line}"),
                   debug=env.debug)
    if dry_run:
        estimate = estimate_job(input_path, output, host=host, **settings)
        for line in [json.dumps(estimate, ensure_ascii=False)] if as_json else estimate_lines(estimate):
            env.out(line)
        return EXIT_OK
    job = start_job(input_path, output, host=host, **settings)
    report, reporter, interrupts = follow(job, quiet=quiet, progress_every=progress_every, env=env)
    return exit_status(report, reporter, interrupts, input_path=input_path, output=output, argv=env.argv,
                       fail_on_error=bool(settings.get("fail_on_error")))
