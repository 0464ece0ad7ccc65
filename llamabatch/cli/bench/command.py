"""`llamabatch bench`: throughput tables, request latency and tick telemetry at several
concurrency levels, optionally against llama-cpp-python called one request at a time."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ... import __version__
from . import benchkit, embed as embed_bench, report
from ...errors import InvalidRequest
from .tables import (baseline_table, batched_table, deterministic_table, latency_table, throughput_table, tick_summary_line, ticks_table, trace_table)
from ..env import Environment
from ..common import EXIT_ERROR, EXIT_USAGE, fail, open_engine, resolve_options
from ..options import SharedOptions, with_shared_options


@with_shared_options
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
    opts: SharedOptions = None,  # type: ignore[assignment]
    env: Environment = None,  # type: ignore[assignment]
) -> None:
    """Measure throughput, request latency and tick telemetry at several concurrency levels.

    For each level B a fresh engine with n_parallel = B loads the model, runs one 1-token warm-up request, then receives all of the level's requests at once. Synthetic prompts are exactly --pp tokens, distinct per request so the prefix cache saves nothing; every request generates exactly --tg tokens. Tables go to stdout, progress to stderr.

    1. llama-batched-bench's columns. One tick may carry prefill and decode tokens together, so each tick's wall time is split by its tokens: T_PP = sum of wall x prefill/batch tokens, T_TG = sum of wall x decode/batch tokens, T = T_PP + T_TG. S_PP and S_TG are tokens evaluated per second of that time, N_KV = prompt + generated tokens, S = N_KV / T.

    2. vLLM's latency names, mean, median and p99 in ms: TTFT, TPOT, ITL (gaps between tokens as they reached the caller), E2EL; then request, output and total token throughput.

    3. Every tick of each level (or the last --ticks N) with its means: batch fill, the share of ticks mixing prefill with decode, and the Python overhead share of tick time.

    4. With --verbose, each level's trace: ticks grouped by kind (decode only, mixed, prefill only), with mean tokens, graph runs (ubatches) per tick, and the mean milliseconds in llama_decode, the C samplers, Python before the plan, filling the llama_batch, and Python after the decode.

    --deterministic runs every level twice, default engine first, and adds a table of what the mode costs: output tokens per second of each and their ratio (the other tables show the deterministic runs).

    --baseline adds llama-cpp-python's Llama.create_completion over the same prompts, one at a time, and a Speedup column: the level's tokens per second of wall clock over the baseline's. Sampling options apply to both; --parallel and --tg replace --n-parallel and --max-tokens.

    --plot draws the figures in the terminal after the tables, --html FILE writes them with the tables and a machine/model/settings header as one self-contained page, and --from-json FILE does both (and the tables) from a recorded --json document without loading a model.
    """
    if plot and report.plot_unavailable():
        raise fail(report.plot_unavailable(), EXIT_USAGE)
    if embed and (plot or html_file is not None or from_json is not None):
        raise fail("--plot, --html and --from-json draw generation levels; they do not apply to --embed", EXIT_USAGE)
    if from_json is not None:
        return _from_recorded(env, from_json, json_file, html_file, plot, ticks, verbose)
    levels, prompt_lines = _check_own_options(parallel, pp, tg, requests, prompts, json_file, ticks, html_file)
    if embed:
        _bench_embed(embed_batch, pp, requests, prompt_lines, prompts, json_file, opts, env)
        return
    if opts["n_parallel"] is not None:
        env.say("llamabatch: note: --n-parallel is ignored; bench sets n_parallel per level from --parallel")
    # Settings are checked against the largest level (not the default 8 slots), so e.g. a small
    # --n-ctx that suits --parallel 2 is accepted; every level is validated again below.
    opts.values["n_parallel"] = max(levels)
    resolved = resolve_options(opts, env)
    if opts["max_tokens"] is not None:
        env.say("llamabatch: note: --max-tokens is ignored; bench generates --tg tokens per request")
    configs = [resolved.engine.replace(n_parallel=b, max_queue=0).validate() for b in levels]
    params = resolved.sampling.replace(max_tokens=tg, ignore_eos=True).validate()
    counts = [requests or b for b in levels]
    smallest_slot = min(c.slot_ctx for c in configs)
    if prompt_lines is None and pp + tg > smallest_slot:
        raise fail(f"--pp {pp} + --tg {tg} = {pp + tg} tokens does not fit a slot of {smallest_slot} "
                   f"(n_ctx / n_parallel); lower them or raise --n-ctx", EXIT_USAGE)

    progress = _progress(env)
    figures: list[dict[str, Any]] = []
    default_figures: list[dict[str, Any]] = []  # with --deterministic: the same levels without it
    deterministic = resolved.engine.deterministic
    model: dict[str, Any] = {}
    all_prompts: list[list[int]] = []
    with progress:
        # progress counts generated tokens, the baseline's included
        task = progress.add_task("bench", total=sum(counts) * tg * (2 if deterministic else 1)
                                 + (max(counts) * tg if baseline else 0))
        advance = lambda n: progress.advance(task, n)  # noqa: E731  (called on the engine thread)
        for b, config, count in zip(levels, configs, counts):
            # --deterministic: the default engine first, then the deterministic one, side by side
            for variant in ([config.replace(deterministic=False)] if deterministic else []) + [config]:
                progress.update(task, description=f"B={b}" + (" deterministic" if variant.deterministic else ""))
                engine = open_engine(dataclasses.replace(resolved, engine=variant), env)
                try:
                    if not all_prompts:
                        model = benchkit.model_info(engine)
                        all_prompts = _build_prompts(engine, prompt_lines, max(counts), pp, tg, smallest_slot)
                    level_prompts = all_prompts[:count]
                    level_pp = pp if prompt_lines is None else sum(map(len, level_prompts)) / len(level_prompts)
                    run = benchkit.run_level(engine, level_prompts, params, on_token=advance)
                finally:
                    engine.close()
                level = benchkit.level_figures(run, level_pp, tg)
                (figures if variant.deterministic == deterministic else default_figures).append(level)
        base = None
        if baseline:
            progress.update(task, description="baseline")
            first = configs[0]
            base = benchkit.run_baseline(model["path"], all_prompts[:max(counts)], tg, threads=first.n_threads,
                                         n_batch=first.n_batch, n_gpu_layers=first.n_gpu_layers,
                                         params=resolved.sampling, on_request=advance, cpu_buffers=first.cpu_buffers)
            for level in figures:
                level.update(benchkit.speedup(level, base))

    document = _document(figures, base, model, resolved, configs[0], levels, counts, pp, tg, requests, prompts)
    if deterministic:
        document["default_levels"] = default_figures  # "levels" are the deterministic runs
    _print_tables(env, figures, base, ticks, configs[0].n_batch, default_figures if deterministic else None, verbose)
    failed = [e for level in figures for e in level["errors"]]
    for level in figures:
        if level["errors"]:
            env.say(f"llamabatch: warning: B={level['n_parallel']}: {len(level['errors'])} of "
                f"{len(level['requests'])} requests failed, first: {level['errors'][0]}")
    if json_file:
        try:
            with open(json_file, "w", encoding="utf-8") as f:
                json.dump(document, f, indent=2)
                f.write("\n")
        except OSError as exc:
            raise fail(f"--json {json_file}: {exc.strerror or exc}", EXIT_ERROR) from None
    _draw(env, document, plot, html_file, ticks)  # after the JSON is safe: a drawing failure loses no figures
    if failed:
        raise typer.Exit(EXIT_ERROR)


def _bench_embed(embed_batch: str, pp: int, requests: int | None, prompt_lines: list[tuple[int, str]] | None,
                 prompts: str | None, json_file: str | None, opts: SharedOptions, env: Environment) -> None:
    """bench --embed (embed.py): one engine per batch size, the same inputs for each."""
    try:
        batches = benchkit.parse_levels(embed_batch)
    except InvalidRequest:
        raise fail(f"--embed-batch must be a comma-separated list of integers >= 1, got {embed_batch!r}",
                   EXIT_USAGE) from None
    opts.values["n_parallel"] = 1  # no generation runs: one slot, the smallest context
    opts.values["n_batch"] = max(batches)
    resolved = resolve_options(opts, env)
    count = requests or embed_bench.DEFAULT_INPUTS
    configs = [resolved.engine.replace(n_parallel=1, n_batch=b, n_ctx=max(b, 256), max_queue=0).validate()
               for b in batches]
    progress = _progress(env)
    figures: list[dict[str, Any]] = []
    model: dict[str, Any] = {}
    inputs: list[list[int]] = []
    with progress:
        task = progress.add_task("embed", total=count * len(batches))
        for config in configs:
            progress.update(task, description=f"batch {config.n_batch}")
            engine = open_engine(dataclasses.replace(resolved, engine=config), env)
            try:
                if not inputs:
                    model = benchkit.model_info(engine)
                    inputs = (benchkit.synthetic_prompts(engine.tokenize, count, pp) if prompt_lines is None else
                              benchkit.cycle_prompts([engine.tokenize(t) for _, t in prompt_lines], count))
                    try:
                        embed_bench.check_batches(batches, inputs)
                    except InvalidRequest as exc:
                        raise fail(str(exc), EXIT_USAGE) from None
                figures.append(embed_bench.run_level(engine, inputs, on_input=lambda n: progress.advance(task, n)))
            finally:
                engine.close()
    out = (Console(file=env.stdout, force_terminal=True) if env.stdout_isatty
           else Console(file=env.stdout, width=200))
    out.print(embed_bench.embed_table(figures, configs[0].n_threads))
    if json_file:
        document = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "llamabatch_version": __version__,
                    "llama_cpp_python_version": benchkit.package_version("llama-cpp-python"),
                    "machine": benchkit.machine_info(), "model": model, "threads": configs[0].n_threads,
                    "settings": {"embed_batches": batches, "inputs": count, "pp": pp if prompts is None else None,
                                 "prompts_file": prompts},
                    "embed_levels": figures}
        try:
            with open(json_file, "w", encoding="utf-8") as f:
                json.dump(document, f, indent=2)
                f.write("\n")
        except OSError as exc:
            raise fail(f"--json {json_file}: {exc.strerror or exc}", EXIT_ERROR) from None
    failed = [e for level in figures for e in level["errors"]]
    if failed:
        env.say(f"llamabatch: warning: {len(failed)} embeddings request(s) failed, first: {failed[0]}")
        raise typer.Exit(EXIT_ERROR)


def _from_recorded(env: Environment, path: str, json_file: str | None, html_file: str | None, plot: bool,
                   ticks: int, verbose: bool) -> None:
    """bench --from-json: the tables, plots and report of a recorded run, without a model."""
    if json_file is not None:
        raise fail("--json and --from-json together: --from-json runs nothing, so there is nothing new to write",
                   EXIT_USAGE)
    if ticks < 0:
        raise fail(f"--ticks must be an integer >= 0, got {ticks}", EXIT_USAGE)
    if html_file is not None and not report.writable(html_file):
        raise fail(f"--html {html_file}: cannot write there", EXIT_USAGE)
    try:
        document = report.load_document(path)
    except InvalidRequest as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    if verbose and not all(isinstance(level.get("trace"), dict) for level in document["levels"]):
        raise fail(f"--verbose: --from-json {path} has no trace (recorded before bench traced its ticks)", EXIT_USAGE)
    settings = document.get("settings") or {}
    _print_tables(env, document["levels"], document.get("baseline"), ticks, settings.get("n_batch") or 0,
                  document.get("default_levels"), verbose)
    _draw(env, document, plot, html_file, ticks)


def _draw(env: Environment, document: dict[str, Any], plot: bool, html_file: str | None, ticks: int) -> None:
    """--plot to stdout after the tables; --html to its file."""
    if plot:
        color, width = report.plot_style(env.stdout_isatty)
        env.out("\n" + report.plots(document, color=color, width=width))
    if html_file is not None:
        try:
            report.write_html(html_file, document, ticks)
        except OSError as exc:
            raise fail(f"--html {html_file}: {exc.strerror or exc}", EXIT_ERROR) from None


def _check_own_options(parallel: str, pp: int, tg: int, requests: int | None, prompts: str | None,
                       json_file: str | None, ticks: int,
                       html_file: str | None = None) -> tuple[list[int], list[tuple[int, str]] | None]:
    """Every bad value is one line and exit 2, before any model is loaded."""
    try:
        levels = benchkit.parse_levels(parallel)
        prompt_lines = benchkit.read_prompt_file(prompts) if prompts is not None else None
    except InvalidRequest as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    for name, value, least in (("--pp", pp, 1), ("--tg", tg, 1), ("--requests", requests, 1), ("--ticks", ticks, 0)):
        if value is not None and value < least:
            raise fail(f"{name} must be an integer >= {least}, got {value}", EXIT_USAGE)
    if json_file is not None:
        folder = os.path.dirname(os.path.abspath(json_file))
        if os.path.isdir(json_file) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) or (
                os.path.exists(json_file) and not os.access(json_file, os.W_OK)):
            raise fail(f"--json {json_file}: cannot write there", EXIT_USAGE)
    if html_file is not None and not report.writable(html_file):
        raise fail(f"--html {html_file}: cannot write there", EXIT_USAGE)
    return levels, prompt_lines


def _build_prompts(engine: Any, prompt_lines: list[tuple[int, str]] | None, count: int, pp: int, tg: int,
                   slot_ctx: int) -> list[list[int]]:
    """Token ids for `count` requests: synthetic, or the file's lines tokenized once (the same
    ids go to every level and to the baseline)."""
    if prompt_lines is None:
        return benchkit.synthetic_prompts(engine.tokenize, count, pp)
    tokenized = []
    for line_no, text in prompt_lines:
        ids = engine.tokenize(text)
        if len(ids) + tg > slot_ctx:
            raise fail(f"--prompts line {line_no}: {len(ids)} prompt tokens + --tg {tg} do not fit a slot of "
                       f"{slot_ctx} (n_ctx / n_parallel)", EXIT_USAGE)
        tokenized.append(ids)
    return benchkit.cycle_prompts(tokenized, count)


def _progress(env: Environment) -> Progress:
    console = Console(file=env.stderr, force_terminal=env.stderr_isatty)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                    TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal)


def _print_tables(env: Environment, figures: list[dict[str, Any]], base: dict[str, Any] | None, last_ticks: int, n_batch: int,
                  default_figures: list[dict[str, Any]] | None = None, verbose: bool = False) -> None:
    out = (Console(file=env.stdout, force_terminal=True) if env.stdout_isatty
           else Console(file=env.stdout, width=200))  # a pipe must not fold columns
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
    if base is not None:
        out.print(baseline_table(base))
        if base["stopped_early"]:
            out.print(f"{base['stopped_early']} baseline request(s) stopped at end-of-generation before --tg "
                      "(llama-cpp-python has no ignore_eos); the speedup compares throughputs",
                      soft_wrap=True, highlight=False)


def _document(figures: list[dict[str, Any]], base: dict[str, Any] | None, model: dict[str, Any], resolved: Any,
              config: Any, levels: list[int], counts: list[int], pp: int, tg: int, requests: int | None,
              prompts: str | None) -> dict[str, Any]:
    s = resolved.sampling
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "llamabatch_version": __version__,
        "llama_cpp_python_version": benchkit.package_version("llama-cpp-python"),
        "machine": benchkit.machine_info(),
        "model": model,
        "threads": config.n_threads,
        "settings": {
            "parallel": levels, "pp": pp if prompts is None else None, "tg": tg, "requests": requests,
            "requests_per_level": counts, "prompts_file": prompts, "policy": config.policy,
            "n_batch": config.n_batch, "chunk_size": config.chunk_size, "cache_prompt": config.cache_prompt,
            "n_ctx": config.n_ctx, "n_gpu_layers": config.n_gpu_layers, "threads": config.n_threads,
            "deterministic": config.deterministic,
            "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                         "repeat_penalty": s.repeat_penalty, "seed": s.seed, "ignore_eos": True},
            "warm_up": benchkit.WARM_UP_NOTE,
            "t_pp_t_tg": "each tick's wall time split by its prefill and decode token counts",
        },
        "levels": figures,
        "baseline": base,
    }
