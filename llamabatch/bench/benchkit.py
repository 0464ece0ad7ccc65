"""Benchmark kit: build a workload, run it through an Engine, turn the records into figures.

Library code for `llamabatch bench` (no printing, no rich/typer). Three families of figures
come from one run of each concurrency level:

* llama-batched-bench's columns (PP, TG, B, N_KV, T_PP, S_PP, T_TG, S_TG, T, S);
* vLLM's serving-benchmark latency names (TTFT, TPOT, ITL, E2EL; mean/median/p99 in ms)
  and throughputs;
* the engine's own tick telemetry: how every forward pass was filled.

How T_PP and T_TG are measured on a continuous-batching engine
----------------------------------------------------------------
llama-batched-bench decodes all prompts in one pass, then runs TG decode passes, so prompt
time and generation time are separate intervals. Here one tick may carry prefill chunks and
decode tokens together. Each tick's wall time (scheduling + llama_decode + sampling +
delivery) is therefore split between the two in proportion to the tokens it carried:

    T_PP = sum over ticks of wall * prefill_tokens / batch_size
    T_TG = sum over ticks of wall * decode_tokens  / batch_size
    T    = T_PP + T_TG = the summed wall time of the level's ticks

When the prompts fit in one batch and no tick mixes the two (the usual small case) this is
exactly the time of the prefill ticks and of the decode ticks. S_PP and S_TG are tokens the
engine evaluated per second of that time: prompt tokens evaluated (not served from the
prefix cache) / T_PP, and decode tokens / T_TG. A request's first token is sampled from its
prompt pass, so the decode passes evaluate TG - 1 tokens per sequence, as many as they
really ran. N_KV = prompt + generated tokens of all requests (B * (PP + TG) when every
request runs to TG), and S = N_KV / T.
"""
from __future__ import annotations

import functools
import math
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..checks.cpus import usable_cpus
from ..errors import InvalidRequest
from ..params import SamplingParams
from ..results import Delta, Result
from ..files.whole_file import read_text
from ..core.telemetry import TickRecord
from .trace import trace_figures

# Ordinary prose, long enough (a few hundred tokens) that prompts built from different
# offsets into it differ from their second token on: the prefix cache cannot make a
# synthetic request cheaper than a real one.
SYNTHETIC_TEXT = (
    "The harbour town woke slowly that autumn. Fishing boats came back before dawn, their decks "
    "loaded with nets, crates of mackerel and the occasional lobster pot that had drifted loose. "
    "In the market square the baker argued with the postmaster about the price of flour, while "
    "children raced between the stalls chasing a grey cat that belonged to nobody in particular. "
    "Up on the hill, the old lighthouse keeper wrote in his journal: wind from the north-west, "
    "visibility eleven miles, three ships sighted, one of them flying a flag he did not recognise. "
    "By noon the fog had lifted and the schoolteacher led her class along the cliff path to count "
    "seabirds, gannets, kittiwakes, a single puffin, and to sketch the ruined chapel whose bell, "
    "people said, still rang on stormy nights. Nobody believed it, yet nobody walked past after dark. "
    "In the evening the tavern filled with sailors, farmers and a travelling clockmaker who repaired "
    "every watch in town for a bowl of soup, a loaf of bread and a bed above the stables."
)

WARM_UP_NOTE = "one 1-token request per level before measuring pages in the weights and sizes the graph"


# -- options ------------------------------------------------------------------------------

def parse_levels(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]. Raises InvalidRequest with one line for anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    levels = []
    for part in parts:
        if not part.lstrip("+").isdigit() or int(part) < 1:
            raise InvalidRequest(f"--parallel must be a comma-separated list of integers >= 1, got {text!r}")
        levels.append(int(part))
    return levels


def read_prompt_file(path: str) -> list[tuple[int, str]]:
    """One prompt per line, as (line number, text); blank lines are skipped. Raises
    InvalidRequest with one line for an unreadable, non-UTF-8 or empty file."""
    text = read_text(path, "--prompts")  # bounded: /dev/zero is one endless line (whole_file)
    lines = re.split(r"\r\n|\r|\n", text)  # the line ends a text-mode file reads, and no others
    if lines[-1] == "":
        lines.pop()
    prompts = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise InvalidRequest(f"--prompts {path}: no prompts (one prompt per line, blank lines are skipped)")
    return prompts


# -- workload -----------------------------------------------------------------------------

def synthetic_prompts(tokenize: Callable[[str], list[int]], count: int, pp: int) -> list[list[int]]:
    """`count` distinct prompts of exactly `pp` token ids.

    Each is the model's start token(s) followed by SYNTHETIC_TEXT's tokens read from a
    different offset (wrapping around), so two prompts share at most the start token and
    an occasional common word: the prefix cache saves next to nothing.
    """
    start = tokenize("")  # the BOS token, if this model adds one
    pool = tokenize(SYNTHETIC_TEXT)[len(start):]
    body_len = max(pp - len(start), 0)
    prompts = []
    for i in range(count):
        offset = (i * 7) % len(pool)  # a stride, so neighbours do not start one word apart
        body = [pool[(offset + k) % len(pool)] for k in range(body_len)]
        prompts.append((start + body)[:pp])
    return prompts


def cycle_prompts(prompts: Sequence[list[int]], count: int) -> list[list[int]]:
    """The first `count` prompts, starting again from the top when the file has fewer."""
    return [list(prompts[i % len(prompts)]) for i in range(count)]


# -- running one level --------------------------------------------------------------------

@dataclass
class RequestTrace:
    """What happened to one request, timed on the engine thread as tokens arrived."""

    index: int
    prompt_tokens: int
    submitted_at: float = 0.0
    token_times: list[float] = field(default_factory=list)  # one perf_counter stamp per generated token
    done_at: float = 0.0
    result: Result | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.finish_reason in ("stop", "length")


@dataclass
class LevelRun:
    """The raw records of one concurrency level."""

    n_parallel: int
    n_batch: int
    traces: list[RequestTrace]
    ticks: list[TickRecord]
    started_at: float
    finished_at: float

    @property
    def elapsed_s(self) -> float:
        return self.finished_at - self.started_at


def _record_event(trace: RequestTrace, on_token: Callable[[int], None] | None, handle: Any, item: Any) -> None:
    # Runs on the engine thread for every Delta and the final Result: stamp, append, return.
    now = time.perf_counter()
    if isinstance(item, Delta):
        if item.token_ids:
            trace.token_times.extend([now] * len(item.token_ids))
            if on_token is not None:
                on_token(len(item.token_ids))
    else:
        trace.done_at = now


def _warm_up(engine: Any, params: SamplingParams, avoid: set[int], candidates: Sequence[int]) -> None:
    """One 1-token request, not part of the figures: the first llama_decode of a fresh
    context pages in the weights and sizes the compute graph, which would otherwise be
    charged to the first level only. Its token is one no prompt starts with, so the slot it
    leaves behind offers the workload no reusable prefix."""
    token = next((t for t in candidates if t not in avoid), None)
    if token is None:
        return
    before = engine.telemetry.totals.ticks
    engine.submit([token], params.replace(max_tokens=1, min_tokens=0, stop=[], timeout=None),
                  stream=False).result()
    # Its tick record is emitted just after its result is delivered: wait for it, so the
    # level's subscriber (which skips ticks up to here) never sees it.
    deadline = time.perf_counter() + 5.0
    while engine.telemetry.totals.ticks <= before and time.perf_counter() < deadline:
        time.sleep(0.001)


def run_level(engine: Any, prompts: Sequence[list[int]], params: SamplingParams, *,
              on_token: Callable[[int], None] | None = None, warm_up: bool = True) -> LevelRun:
    """Submit every prompt at once (as llama-batched-bench starts all B sequences together),
    wait for every result, then close `engine`.

    Closing is part of the measurement: it joins the engine thread, and only then is the
    record of the last tick (emitted after that tick's results) guaranteed to be collected.
    `on_token(n)` is called on the engine thread as tokens arrive (for a progress bar).
    """
    if warm_up and prompts:
        _warm_up(engine, params, {p[0] for p in prompts if p}, [t for p in prompts for t in p])
    skip_through = engine.telemetry.totals.ticks
    ticks: list[TickRecord] = []

    def on_record(record: Any) -> None:
        if isinstance(record, TickRecord) and record.tick > skip_through:
            ticks.append(record)

    unsubscribe = engine.subscribe(on_record)
    traces = [RequestTrace(i, len(p)) for i, p in enumerate(prompts)]
    handles = []
    started = time.perf_counter()
    try:
        with engine.hold():  # all of them reach the engine together, as B sequences start in llama-batched-bench
            for trace, prompt in zip(traces, prompts):
                trace.submitted_at = time.perf_counter()
                handles.append(engine.submit(list(prompt), params, stream=False,
                                             callback=functools.partial(_record_event, trace, on_token)))
        for trace, handle in zip(traces, handles):
            trace.result = handle.result()
    finally:
        engine.close()  # after this, every callback (and so every done_at stamp) has run
        unsubscribe()
    closed = time.perf_counter()
    for trace in traces:
        trace.done_at = trace.done_at or closed
    finished = max((t.done_at for t in traces), default=started)
    return LevelRun(engine.config.n_parallel, engine.config.n_batch, traces, ticks, started, finished)


# -- figures ------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics (numpy's
    default, which vLLM's benchmark uses). 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def describe(values: Sequence[float]) -> dict[str, float]:
    """mean / median / p99 (0.0 each for no values, as vLLM reports them)."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "p99": percentile(values, 99)}


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def batched_figures(run: LevelRun, pp: float, tg: int) -> dict[str, Any]:
    """llama-batched-bench's row for one level (JSON keys as its --output-format jsonl)."""
    t_pp = sum(t.wall_ms * _div(t.prefill_tokens, t.batch_size) for t in run.ticks) / 1000
    t_tg = sum(t.wall_ms * _div(t.decode_tokens, t.batch_size) for t in run.ticks) / 1000
    prefill_tokens = sum(t.prefill_tokens for t in run.ticks)
    decode_tokens = sum(t.decode_tokens for t in run.ticks)
    results = [t.result for t in run.traces if t.result is not None]
    prompt_tokens = sum(r.usage.prompt_tokens for r in results)
    cached_tokens = sum(r.usage.cached_tokens for r in results)
    generated = sum(r.usage.completion_tokens for r in results)
    n_kv = prompt_tokens + generated
    t = t_pp + t_tg
    return {
        "pp": pp, "tg": tg, "pl": run.n_parallel, "n_requests": len(run.traces), "n_kv": n_kv,
        "t_pp": t_pp, "speed_pp": _div(prefill_tokens, t_pp),
        "t_tg": t_tg, "speed_tg": _div(decode_tokens, t_tg),
        "t": t, "speed": _div(n_kv, t),
        "elapsed_s": run.elapsed_s,
        "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens, "prefill_tokens": prefill_tokens,
        "generated_tokens": generated, "decode_tokens": decode_tokens,
        "failed": sum(1 for tr in run.traces if not tr.ok),
    }


def request_latencies(trace: RequestTrace) -> dict[str, Any]:
    """One request's latencies in ms, as vLLM defines them: TTFT from submit to the first
    token; E2EL from submit to the result; TPOT = (E2EL - TTFT) / (output tokens - 1);
    ITL the gaps between consecutive tokens."""
    ttft = (trace.token_times[0] - trace.submitted_at) * 1000 if trace.token_times else 0.0
    e2el = (trace.done_at - trace.submitted_at) * 1000
    n_out = len(trace.token_times)
    tpot = (e2el - ttft) / (n_out - 1) if n_out > 1 else None
    itl = [(b - a) * 1000 for a, b in zip(trace.token_times, trace.token_times[1:])]
    return {"ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "e2el_ms": e2el, "output_tokens": n_out}


def latency_figures(traces: Sequence[RequestTrace]) -> dict[str, Any]:
    """vLLM's serving-benchmark figures over the requests that completed (stop or length)."""
    done = [t for t in traces if t.ok]
    per = [request_latencies(t) for t in done]
    ttft = [p["ttft_ms"] for p in per if p["output_tokens"]]
    tpot = [p["tpot_ms"] for p in per if p["tpot_ms"] is not None]
    itl = [gap for p in per for gap in p["itl_ms"]]
    e2el = [p["e2el_ms"] for p in per]
    duration = (max(t.done_at for t in traces) - min(t.submitted_at for t in traces)) if traces else 0.0
    total_input = sum(t.result.usage.prompt_tokens for t in done)  # type: ignore[union-attr]
    total_output = sum(t.result.usage.completion_tokens for t in done)  # type: ignore[union-attr]
    out: dict[str, Any] = {
        "completed": len(done), "failed": len(traces) - len(done), "duration": duration,
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": _div(len(done), duration),
        "output_throughput": _div(total_output, duration),
        "total_token_throughput": _div(total_input + total_output, duration),
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for stat, value in describe(values).items():
            out[f"{stat}_{name}_ms"] = value
    return out


def tick_summary(ticks: Sequence[TickRecord], n_parallel: int, n_batch: int) -> dict[str, Any]:
    """How the level's forward passes were filled.

    batch fill: mean tokens per tick as a share of the n_batch budget (token_fill), and mean
    sequences holding a slot per tick as a share of B (slot_fill); mixed_share: ticks that
    carried prefill and decode tokens together; overhead_share: the part of tick wall time
    spent in Python (scheduling, batch filling, detokenizing, delivery), not in llama_decode
    or the C samplers.
    """
    n = len(ticks)
    wall = sum(t.wall_ms for t in ticks)
    return {
        "ticks": n,
        "mean_batch_size": _div(sum(t.batch_size for t in ticks), n),
        "mean_decode_tokens": _div(sum(t.decode_tokens for t in ticks), n),
        "mean_prefill_tokens": _div(sum(t.prefill_tokens for t in ticks), n),
        "mean_active_slots": _div(sum(t.active_slots for t in ticks), n),
        "mean_queue_depth": _div(sum(t.queue_depth for t in ticks), n),
        "mean_eval_ms": _div(sum(t.eval_ms for t in ticks), n),
        "mean_sample_ms": _div(sum(t.sample_ms for t in ticks), n),
        "mean_overhead_ms": _div(sum(t.overhead_ms for t in ticks), n),
        "max_decode_tokens": max((t.decode_tokens for t in ticks), default=0),
        "token_fill": _div(sum(t.batch_size for t in ticks), n * n_batch),
        "slot_fill": _div(sum(t.active_slots for t in ticks), n * n_parallel),
        "mixed_share": _div(sum(1 for t in ticks if t.prefill_tokens and t.decode_tokens), n),
        "overhead_share": _div(sum(t.overhead_ms for t in ticks), wall),
        "wall_ms": wall,
    }


def level_figures(run: LevelRun, pp: float, tg: int) -> dict[str, Any]:
    """Everything one level measured, as plain JSON-ready data."""
    ticks = [t.to_dict() for t in run.ticks]
    return {
        "n_parallel": run.n_parallel,
        "batched": batched_figures(run, pp, tg),
        "latency": latency_figures(run.traces),
        "tick_summary": tick_summary(run.ticks, run.n_parallel, run.n_batch),
        "ticks": ticks,
        "trace": trace_figures(ticks),
        "requests": [_request_row(t) for t in run.traces],
        "errors": [f"request {t.index}: {t.result.error if t.result else 'no result'}"
                   for t in run.traces if not t.ok],
    }


def _request_row(trace: RequestTrace) -> dict[str, Any]:
    lat = request_latencies(trace)
    r = trace.result
    return {
        "index": trace.index, "finish_reason": r.finish_reason if r else None,
        "prompt_tokens": r.usage.prompt_tokens if r else trace.prompt_tokens,
        "cached_tokens": r.usage.cached_tokens if r else 0,
        "completion_tokens": r.usage.completion_tokens if r else 0,
        "ttft_ms": lat["ttft_ms"], "tpot_ms": lat["tpot_ms"], "e2el_ms": lat["e2el_ms"],
    }


# -- the sequential baseline --------------------------------------------------------------

def run_baseline(model_path: str, prompts: Sequence[list[int]], max_tokens: int, *, threads: int, n_batch: int,
                 n_gpu_layers: int, params: SamplingParams,
                 on_request: Callable[[int], None] | None = None, cpu_buffers: str | None = None) -> dict[str, Any]:
    """llama-cpp-python's Llama.create_completion over `prompts`, one after another.

    llama-cpp-python has no ignore_eos, and forcing one through its Python logits processor
    costs a full-vocabulary numpy pass per token that would slow the baseline unfairly, so a
    baseline request may stop before `max_tokens`: the comparison uses throughputs.
    """
    from .baseline import sequential_baseline  # imports llama_cpp: only when a baseline is asked for

    n_ctx = max((len(p) for p in prompts), default=1) + max_tokens + 1
    records = sequential_baseline(model_path, [list(p) for p in prompts], max_tokens, threads=threads,
                                  n_ctx=n_ctx, n_batch=n_batch, n_gpu_layers=n_gpu_layers, params=params,
                                  on_request=on_request, cpu_buffers=cpu_buffers)
    return baseline_figures(records)


def baseline_figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals of the sequential run: records carry seconds, prompt_tokens, completion_tokens."""
    seconds = sum(r["seconds"] for r in records)
    prompt = sum(r["prompt_tokens"] for r in records)
    generated = sum(r["completion_tokens"] for r in records)
    return {
        "method": "llama_cpp.Llama.create_completion, one request at a time",
        "requests": len(records), "seconds": seconds,
        "prompt_tokens": prompt, "generated_tokens": generated,
        "stopped_early": sum(1 for r in records if r.get("finish_reason") != "length"),
        "request_throughput": _div(len(records), seconds),
        "output_throughput": _div(generated, seconds),
        "total_token_throughput": _div(prompt + generated, seconds),
        "mean_e2el_ms": _div(seconds * 1000, len(records)),
        "per_request": list(records),
    }


def speedup(level: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """How much more throughput a level got than the sequential baseline, both by wall clock
    (first submit to last result vs the sum of the create_completion calls): on all tokens
    (prompt + generated) and on generated tokens alone."""
    lat = level["latency"]
    return {
        "speedup": _div(lat["total_token_throughput"], baseline["total_token_throughput"]),
        "speedup_output": _div(lat["output_throughput"], baseline["output_throughput"]),
    }


# -- context ------------------------------------------------------------------------------

def package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    usable = usable_cpus()
    return {
        "platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "cpus_usable": usable,
    }


def model_info(engine: Any) -> dict[str, Any]:
    meta = engine.runner.metadata
    path = str(engine.model_path)
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    return {
        "name": engine.model_name, "path": path, "file_size": size,
        "architecture": meta.get("general.architecture"), "general_name": meta.get("general.name"),
        "size_label": meta.get("general.size_label"), "file_type": meta.get("general.file_type"),
        "n_vocab": engine.runner.n_vocab, "slot_ctx": engine.slot_ctx,
    }
