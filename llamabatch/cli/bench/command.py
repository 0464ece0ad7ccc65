"""`llamabatch bench`: throughput tables, request latency and tick telemetry at several
concurrency levels, optionally against llama-cpp-python called one request at a time.

The measuring is the library's (llamabatch/bench/); this module turns the command line into
its calls and shows the figures: progress on stderr, tables and plots on stdout."""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ...bench import embed as embed_bench, report
from ...bench.checks import check_modes, check_own_options, load_recorded
from ...bench.document import embed_document, generation_document, write_json
from ...bench.generation import plan_generation, run_generation
from ...bench.tables import (baseline_table, batched_table, deterministic_table, kv_types_table, latency_table, throughput_table, tick_summary_line, ticks_table, trace_table)
from ..engine_setup import open_engine, resolve_options
from ..exit_status import EXIT_ERROR
from ..env import Environment
from ..engine_options import EngineOptions, with_engine_options


@with_engine_options
def bench_command(
    parallel: Annotated[str, typer.Option("--parallel", metavar="LIST",
                                          help="Concurrency levels B, comma-separated; each level gets its own engine with n_parallel = B.")] = "1,2,4,8,16",
    pp: Annotated[int, typer.Option("--pp", metavar="N", help="Prompt tokens per synthetic request.")] = 32,
    tg: Annotated[int, typer.Option("--tg", metavar="N", help="Tokens generated per request (ignore_eos: exactly N).")] = 64,
    requests: Annotated[Optional[int], typer.Option("--requests", metavar="N", show_default=False,
                                                    help="Requests per level (default: B, all submitted at once, as llama-batched-bench runs B sequences).")] = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", metavar="FILE", show_default=False,
                                                   help="Real prompts instead of synthetic ones: one per line, reused from the top when a level needs more.")] = None,
    baseline: Annotated[bool, typer.Option("--baseline", help="Also run llama-cpp-python's Llama.create_completion over the same prompts one at a time, and show each level's speedup.")] = False,
    json_file: Annotated[Optional[str], typer.Option("--json", metavar="FILE", show_default=False,
                                                     help="Write every figure (levels, latency, ticks, baseline, machine, model, versions) as JSON.")] = None,
    ticks: Annotated[int, typer.Option("--ticks", metavar="N", help="Show only the last N ticks of each level (0 = all).")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print each level's trace: its ticks by kind (decode, mixed, prefill) with graph runs per tick and where the tick's time went (llama_decode, sampling, Python before, batch filling, Python after).")] = False,
    embed: Annotated[bool, typer.Option("--embed", rich_help_panel="Embeddings", help="Measure embeddings instead of generation: inputs/s and tokens/s at each --embed-batch size, --requests inputs (default 256) of --pp tokens (or the --prompts lines), one request each, all at once.")] = False,
    embed_batch: Annotated[str, typer.Option("--embed-batch", metavar="LIST", rich_help_panel="Embeddings", help="With --embed: batch sizes (the most tokens per llama_decode, i.e. n_batch), comma-separated; each gets its own engine.")] = embed_bench.DEFAULT_BATCHES,
    plot: Annotated[bool, typer.Option("--plot", help="Also draw the figures in the terminal, after the tables: S_TG against B with the B that n_parallel auto would pick marked, TTFT and TPOT (p50, p99) against B, and each level's tick timeline. Plain ASCII without colour when stdout is not a terminal or NO_COLOR is set.")] = False,
    html_file: Annotated[Optional[str], typer.Option("--html", metavar="FILE", show_default=False,
                                                     help="Write one self-contained HTML report (no script, nothing fetched): a machine/model/settings header, the --plot charts as inline SVG, and the tables.")] = None,
    from_json: Annotated[Optional[str], typer.Option("--from-json", metavar="FILE", show_default=False,
                                                     help="Run nothing: print the tables of a recorded --json document, and its --plot and --html. No model is loaded.")] = None,
    opts: EngineOptions = None,  # type: ignore[assignment]
    env: Environment = None,  # type: ignore[assignment]
) -> None:
    """Measure throughput, request latency and tick telemetry at several concurrency levels.

    For each level B a fresh engine with n_parallel = B loads the model, runs one 1-token warm-up request, then receives all of the level's requests at once. Synthetic prompts are exactly --pp tokens, distinct per request so the prefix cache saves nothing; every request generates exactly --tg tokens. Tables go to stdout, progress to stderr.

    1. llama-batched-bench's columns. One tick may carry prefill and decode tokens together, so each tick's wall time is split by its tokens: T_PP = sum of wall x prefill/batch tokens, T_TG = sum of wall x decode/batch tokens, T = T_PP + T_TG. S_PP and S_TG are tokens evaluated per second of that time, N_KV = prompt + generated tokens, S = N_KV / T.

    2. vLLM's latency names, mean, median and p99 in ms: TTFT, TPOT, ITL (gaps between tokens as they reached the caller), E2EL; then request, output and total token throughput.

    3. Every tick of each level (or the last --ticks N) with its means: batch fill, the share of ticks mixing prefill with decode, and the Python overhead share of tick time.

    4. With --verbose, each level's trace: ticks grouped by kind (decode only, mixed, prefill only), with mean tokens, graph runs (ubatches) per tick, and the mean milliseconds in llama_decode, the C samplers, Python before the plan, filling the llama_batch, and Python after the decode.

    --deterministic runs every level twice, default engine first, and adds a table of what the mode costs: output tokens per second of each and their ratio (the other tables show the deterministic runs).

    --cache-type-k/--cache-type-v other than f16 run every level twice too, an f16 engine first, and add a table of both caches side by side: output tokens per second, KV MiB per slot (llama.cpp's count) and their ratios (the other tables show the chosen types).

    --baseline adds llama-cpp-python's Llama.create_completion over the same prompts, one at a time, and a Speedup column: the level's tokens per second of wall clock over the baseline's. Sampling options apply to both; --parallel and --tg replace --n-parallel and --max-tokens.

    --plot draws the figures in the terminal after the tables, --html FILE writes them with the tables and a machine/model/settings header as one self-contained page, and --from-json FILE does both (and the tables) from a recorded --json document without loading a model.
    """
    check_modes(plot, embed, html_file, from_json)
    if from_json is not None:
        document = load_recorded(from_json, json_file, html_file, ticks, verbose)
        settings = document.get("settings") or {}
        _print_tables(env, document["levels"], document.get("baseline"), ticks, settings.get("n_batch") or 0,
                      document.get("default_levels"), verbose, document.get("f16_levels"))
        _draw(env, document, plot, html_file, ticks)
        return
    levels, prompt_lines = check_own_options(parallel, pp, tg, requests, prompts, json_file, ticks, html_file)
    if embed:
        _bench_embed(embed_batch, pp, requests, prompt_lines, prompts, json_file, opts, env)
    else:
        _bench_generation(levels, prompt_lines, pp, tg, requests, prompts, baseline, json_file, ticks, verbose,
                          plot, html_file, opts, env)


def _bench_generation(levels: list[int], prompt_lines: list[tuple[int, str]] | None, pp: int, tg: int,
                      requests: int | None, prompts: str | None, baseline: bool, json_file: str | None, ticks: int,
                      verbose: bool, plot: bool, html_file: str | None, opts: EngineOptions, env: Environment) -> None:
    """The generation levels (llamabatch/bench/generation.py), their tables, JSON and drawings."""
    if opts["n_parallel"] is not None:
        env.say("llamabatch: note: --n-parallel is ignored; bench sets n_parallel per level from --parallel")
    # Settings are checked against the largest level (not the default 8 slots), so e.g. a small
    # --n-ctx that suits --parallel 2 is accepted; every level is validated again below.
    opts.values["n_parallel"] = max(levels)
    resolved = resolve_options(opts, env)
    if opts["max_tokens"] is not None:
        env.say("llamabatch: note: --max-tokens is ignored; bench generates --tg tokens per request")
    plan = plan_generation(resolved, levels, pp, tg, requests, prompt_lines, baseline)
    progress = _progress(env)
    with progress:
        task = progress.add_task("bench", total=plan.tokens_to_generate())
        run = run_generation(plan, resolved, lambda settings: open_engine(settings, env),
                             phase=lambda name: progress.update(task, description=name),
                             advance=lambda n: progress.advance(task, n))  # advance: on the engine thread
    document = generation_document(plan, run, resolved.sampling, requests, prompts)
    _print_tables(env, run.figures, run.base, ticks, plan.configs[0].n_batch,
                  run.default_figures if plan.deterministic else None, verbose,
                  run.f16_figures if plan.compare_kv else None)
    for level in run.figures:
        if level["errors"]:
            env.say(f"llamabatch: warning: B={level['n_parallel']}: {len(level['errors'])} of "
                    f"{len(level['requests'])} requests failed, first: {level['errors'][0]}")
    if json_file:
        write_json(json_file, document)
    _draw(env, document, plot, html_file, ticks)  # after the JSON is safe: a drawing failure loses no figures
    if run.errors:
        raise typer.Exit(EXIT_ERROR)


def _bench_embed(embed_batch: str, pp: int, requests: int | None, prompt_lines: list[tuple[int, str]] | None,
                 prompts: str | None, json_file: str | None, opts: EngineOptions, env: Environment) -> None:
    """bench --embed (llamabatch/bench/embed.py): one engine per batch size, the same inputs for each."""
    batches = embed_bench.parse_batches(embed_batch)
    opts.values["n_parallel"] = 1  # no generation runs: one slot, the smallest context
    opts.values["n_batch"] = max(batches)
    resolved = resolve_options(opts, env)
    count = requests or embed_bench.DEFAULT_INPUTS
    configs = embed_bench.plan_configs(resolved, batches)
    progress = _progress(env)
    with progress:
        task = progress.add_task("embed", total=count * len(batches))
        figures, model = embed_bench.run_levels(resolved, configs, count, pp, prompt_lines,
                                                lambda settings: open_engine(settings, env),
                                                phase=lambda name: progress.update(task, description=name),
                                                advance=lambda n: progress.advance(task, n))
    _stdout_console(env).print(embed_bench.embed_table(figures, configs[0].n_threads))
    if json_file:
        write_json(json_file, embed_document(figures, model, configs[0].n_threads, batches, count, pp, prompts))
    failed = [e for level in figures for e in level["errors"]]
    if failed:
        env.say(f"llamabatch: warning: {len(failed)} embeddings request(s) failed, first: {failed[0]}")
        raise typer.Exit(EXIT_ERROR)


def _draw(env: Environment, document: dict[str, Any], plot: bool, html_file: str | None, ticks: int) -> None:
    """--plot to stdout after the tables; --html to its file."""
    if plot:
        color, width = report.plot_style(env.stdout_isatty)
        env.out("\n" + report.plots(document, color=color, width=width))
    if html_file is not None:
        report.write_html(html_file, document, ticks)


def _stdout_console(env: Environment) -> Console:
    return (Console(file=env.stdout, force_terminal=True) if env.stdout_isatty
            else Console(file=env.stdout, width=200))  # a pipe must not fold columns


def _progress(env: Environment) -> Progress:
    console = Console(file=env.stderr, force_terminal=env.stderr_isatty)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                    TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal)


def _print_tables(env: Environment, figures: list[dict[str, Any]], base: dict[str, Any] | None, last_ticks: int, n_batch: int,
                  default_figures: list[dict[str, Any]] | None = None, verbose: bool = False,
                  f16_figures: list[dict[str, Any]] | None = None) -> None:
    out = _stdout_console(env)
    out.print(batched_table(figures, with_speedup=base is not None))
    out.print(latency_table(figures))
    out.print(throughput_table(figures))
    for level in figures:
        out.print(ticks_table(level, last_ticks))
        out.print(tick_summary_line(level, n_batch), soft_wrap=True, highlight=False)
        if verbose:
            out.print(trace_table(level))
    if default_figures is not None:  # --deterministic: what the mode costs, level by level
        out.print(deterministic_table(default_figures, figures))
    if f16_figures:  # KV types other than f16: what they save and cost, level by level
        out.print(kv_types_table(f16_figures, figures))
    if base is not None:
        out.print(baseline_table(base))
        if base["stopped_early"]:
            out.print(f"{base['stopped_early']} baseline request(s) stopped at end-of-generation before --tg "
                      "(llama-cpp-python has no ignore_eos); the speedup compares throughputs",
                      soft_wrap=True, highlight=False)
