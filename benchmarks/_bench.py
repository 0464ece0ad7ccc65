"""What every benchmark script repeats, written once: the workload arguments, the model, the
prompts, timed generate() runs with their TickRecords, the sequential llama-cpp-python
baseline, `llamabatch run` as a subprocess, the machine line, and the A B pair printout.

The scripts import it as `from _bench import ...` (Python puts a script's own folder on the
path). It is not a benchmark itself and asserts nothing on time: benchmarks measure and print.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence


def say(*args) -> None:
    """A progress line for people: on stderr, so stdout keeps only the figures."""
    print(*args, file=sys.stderr, flush=True)


# -- arguments ------------------------------------------------------------------------------

_UNSET: Any = object()


def workload_args(ap: argparse.ArgumentParser, *, prompts: int = _UNSET, tokens: int = _UNSET,
                  slots: Any = _UNSET, threads: int = _UNSET, rounds: int = _UNSET, model: bool = False,
                  cpu_buffers: bool = False) -> argparse.ArgumentParser:
    """Add the options most scripts share, each only where the script gives it a default
    (so a script's --help lists only what it reads). `slots` as a string ("8" or "8,16") is a
    comma-separated list, read back with int_list(); as an int, one slot count."""
    if prompts is not _UNSET:
        ap.add_argument("--prompts", type=int, default=prompts, help=f"number of prompts (default {prompts})")
    if tokens is not _UNSET:
        ap.add_argument("--tokens", type=int, default=tokens, help=f"new tokens per prompt (default {tokens})")
    if slots is not _UNSET:
        if isinstance(slots, str):
            ap.add_argument("--slots", default=slots, help=f"engine slot counts, comma-separated (default {slots})")
        else:
            ap.add_argument("--slots", type=int, default=slots, help=f"engine slots (default {slots})")
    if threads is not _UNSET:
        ap.add_argument("--threads", type=int, default=threads, help=f"CPU threads (default {threads})")
    if rounds is not _UNSET:
        ap.add_argument("--rounds", type=int, default=rounds, help=f"A B pairs (default {rounds})")
    if model:
        ap.add_argument("-m", "--model", default=None,
                        help="GGUF model: a path or any name `llamabatch -m` takes (default: the bundled Gemma 3 270M)")
    if cpu_buffers:
        ap.add_argument("--cpu-buffers", choices=["auto", "plain", "repack"], default=None,
                        help="CPU weight layout [default: auto, what this machine would choose]")
    return ap


def int_list(ap: argparse.ArgumentParser, text: str, name: str = "--slots") -> list[int]:
    """'8,16' -> [8, 16]; a usage error (exit 2) for anything else or a value below 1."""
    try:
        values = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        ap.error(f"{name} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        ap.error(f"{name} values must be >= 1, got {text!r}")
    return values


def positive(ap: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """A usage error when any of the named integer options is below 1."""
    low = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) < 1]
    if low:
        ap.error(f"{', '.join(low)} must be >= 1")


# -- the model and the machine ----------------------------------------------------------------

def model_path(model: str | None) -> str:
    """The GGUF a --model value means (None: the bundled model), checked to be a GGUF."""
    from llamabatch.models.gguf_header import check_gguf
    from llamabatch.models.resolve import resolve_model

    path = resolve_model(model)
    check_gguf(path)
    return path


def kernels(model: str, cpu_buffers: str | None = None):
    """The weight layout (llama.cpp kernels) `cpu_buffers` means here for this model."""
    from llamabatch import EngineConfig
    from llamabatch.llama.cpu_kernels import kernel_path

    return kernel_path(EngineConfig(model=model, cpu_buffers=cpu_buffers), model)


def machine_line(model: str | None = None, cpu_buffers: str | None = None) -> str:
    """CPU name, cores, the 1-minute load average, and with a model the kernel path: what a
    reader needs to place a figure (results from a loaded machine read differently)."""
    from llamabatch.kernel_paths.machine_verdicts import cpu_name

    line = f"{cpu_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"
    if model is not None:
        path = kernels(model, cpu_buffers)
        line += f"; {path.name} kernels ({path.why})"
        if path.use_extra_bufts and not repacks(model):
            # llama.cpp is allowed CPU_REPACK, but none of this model's weight types repacks here
            line += "; no weight of this model repacks on this CPU: all plain"
    return line


def repacks(model: str) -> bool:
    """Whether any weight of `model` goes to CPU_REPACK on this CPU (the rule ggml applies)."""
    from llamabatch.llama.cpu_kernels import cpu_features
    from llamabatch.models.gguf_header import read_tensor_infos
    from llamabatch.kernel_paths.repack_rule import repacked_names

    return bool(repacked_names(read_tensor_infos(model), cpu_features()))


# -- prompts ---------------------------------------------------------------------------------

ESSAY_TOPICS = [
    "a lighthouse keeper", "the history of bread", "a robot learning to paint", "volcanoes", "a chess match",
    "the moon landing", "a lost cat", "honeybees", "a train journey across Siberia", "quantum computers",
    "an old library", "the first winter in a new city", "tides", "a jazz musician", "glaciers",
    "a small bakery", "desert plants", "a mountain rescue", "the printing press", "octopuses",
    "a marathon runner", "the northern lights", "a city at night", "ancient Rome", "a garden in spring",
    "submarines", "a village festival", "coral reefs", "a detective story", "the invention of the telephone",
    "migrating birds", "a storm at sea", "a clockmaker", "rainforests", "a space station", "the Silk Road"]


def sky_prompts(n: int, *, short: bool = False) -> list[str]:
    """n distinct short questions (the same as ../shared/tools/reference_throughput.py);
    `short` drops "and red at dusk" (the logprobs benchmark's workload)."""
    tail = "." if short else " and red at dusk."
    return [f"Question {i}: explain in a few sentences why the sky looks blue at noon{tail}" for i in range(n)]


def essay_prompts(n: int) -> list[str]:
    """n open-ended essay openings that keep a model generating (no early end of text)."""
    return [f"Here is a long, detailed essay about {ESSAY_TOPICS[i % len(ESSAY_TOPICS)]} "
            f"(part {i // len(ESSAY_TOPICS) + 1}):\n\n" for i in range(n)]


# -- timed engine runs -----------------------------------------------------------------------

@dataclass
class Timed:
    """One timed generate(): its results, wall seconds and the TickRecords of the run."""
    results: list
    seconds: float
    ticks: list = field(default_factory=list)

    @property
    def generated(self) -> int:
        return sum(r.usage.completion_tokens for r in self.results)

    @property
    def tok_s(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0

    @property
    def failed(self) -> list:
        return [r for r in self.results if not r.ok]


def timed_generate(engine, prompts: Sequence, params) -> Timed:
    """engine.generate(prompts, params), timed, with the run's TickRecords."""
    from llamabatch import TickRecord

    ticks: list = []
    unsubscribe = engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
    try:
        t0 = time.perf_counter()
        results = engine.generate(prompts, params)
        seconds = time.perf_counter() - t0
    finally:
        unsubscribe()
    return Timed(results, seconds, ticks)


# -- the sequential baseline -------------------------------------------------------------------

@dataclass
class Sequential:
    tokens: int          # completion tokens generated
    seconds: float       # generation time (model load and warm-up not included)
    load_seconds: float  # the model load
    continued: int       # completions continued past an early end of text (same_length)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def sequential(model: str, prompts: Sequence[str], max_tokens: int, *, threads: int, n_ctx: int,
               warm_up: bool = True, same_length: bool = False) -> Sequential:
    """llama-cpp-python's Llama.create_completion over the prompts one at a time, greedy —
    what a Python user has without llamabatch — on the kernels the engine would run.

    `same_length`: a completion that ends early is continued with end-of-generation banned,
    so it generates max_tokens like an engine request with ignore_eos (the ban is a Python
    logits processor, so it runs only where needed). Runs on a thread of its own: an OpenMP
    team left on the caller's thread slows the engine's ticks afterwards (see
    llamabatch.bench.baseline.run_in_own_thread)."""
    from llamabatch.bench.baseline import run_in_own_thread

    return run_in_own_thread(_sequential, model, list(prompts), max_tokens, threads, n_ctx, warm_up, same_length)


def _sequential(model: str, prompts: list[str], max_tokens: int, threads: int, n_ctx: int, warm_up: bool,
                same_length: bool) -> Sequential:
    import llama_cpp  # benchmarks may import llama_cpp; the library keeps it in its llama/ boundary

    from llamabatch.llama.cpu_kernels import high_level_llama  # on the layout the engine loads (see there)

    t0 = time.perf_counter()
    llm = high_level_llama(model, None, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    load = time.perf_counter() - t0
    try:
        if warm_up:
            llm.create_completion("warm up", max_tokens=4, temperature=0.0)
        eog_bias: dict[int, float] | None = None
        continued = total = 0
        t0 = time.perf_counter()
        for prompt in prompts:
            out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
            n = out["usage"]["completion_tokens"]
            if same_length and n < max_tokens:
                if eog_bias is None:
                    vocab = llm._model.vocab
                    eog_bias = {t: -math.inf for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}
                more = llm.create_completion(prompt + out["choices"][0]["text"], max_tokens=max_tokens - n,
                                             temperature=0.0, logit_bias=eog_bias)
                n += more["usage"]["completion_tokens"]
                continued += 1
            total += n
        seconds = time.perf_counter() - t0
    finally:
        llm.close()
    return Sequential(total, seconds, load, continued)


# -- `llamabatch run` as a subprocess -------------------------------------------------------------

def write_prompt_lines(path: Path, prompts: Sequence[str], tokens: int) -> Path:
    """A `run` input file: one greedy line per prompt, generating exactly `tokens` (ignore_eos)."""
    with open(path, "w") as f:
        for i, prompt in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                                "ignore_eos": True}) + "\n")
    return path


def llamabatch_command(*args: str) -> list[str]:
    """`llamabatch ARGS` run with this Python (the checkout's llamabatch, not one on PATH)."""
    return [sys.executable, "-m", "llamabatch", *args]


def read_records(out: Path, expected: int) -> list[dict]:
    """The records of a finished `run`; exits when a line failed or one is missing."""
    records = [json.loads(line) for line in out.read_text().splitlines()]
    failed = [r for r in records if r["error"] is not None]
    if failed or len(records) != expected:
        raise SystemExit(f"llamabatch run: {len(failed)} failed lines, {len(records)} of {expected} records: "
                         f"{failed[:1]}")
    return records


def timed_run(lines: Path, out: Path, expected: int, model: str, threads: int, *flags: str) -> float:
    """Wall seconds of one `llamabatch run` of `lines` (no prefix store: nothing an earlier run
    saved is restored); exits when the run fails or a line has no good record."""
    out.unlink(missing_ok=True)
    command = llamabatch_command("run", str(lines), "-o", str(out), "-m", model, "--threads", str(threads),
                                 "--prefix-store", "off", "-q", *flags)
    t0 = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"llamabatch run {' '.join(flags)} exited {done.returncode}: {done.stderr[-400:]}")
    read_records(out, expected)
    return wall


def completion_tokens(records: list[dict]) -> int:
    return sum(r["usage"]["completion_tokens"] for r in records)


# -- A B pairs ---------------------------------------------------------------------------------

@dataclass
class Pairs:
    """Ratios B/A of alternating A B runs. The machines these run on are shared, so a ratio
    within one pair is the figure to read, and the median over pairs the summary."""
    ratios: list[float] = field(default_factory=list)

    def add(self, a: float, b: float) -> float:
        ratio = b / a if a else math.nan
        self.ratios.append(ratio)
        return ratio

    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else math.nan


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (statistics.quantiles' default method); the value itself for one."""
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def run_pairs(rounds: int, run_a: Callable[[], Any], run_b: Callable[[], Any],
              report: Callable[[int, Any, Any], None]) -> list[tuple[Any, Any]]:
    """A B A B ...: `rounds` pairs, each reported as soon as it is measured (1-based round)."""
    pairs = []
    for r in range(1, rounds + 1):
        a = run_a()
        b = run_b()
        pairs.append((a, b))
        report(r, a, b)
    return pairs


# -- tick traces ---------------------------------------------------------------------------

class TickLog:
    """Every tick record `engine` reports (Engine.subscribe; a supervised engine forwards its
    child's), kept until `take`."""

    def __init__(self, engine: Any):
        self.records: list[Any] = []
        engine.subscribe(lambda r: self.records.append(r) if getattr(r, "kind", "") == "tick" else None)

    def take(self) -> list[Any]:
        """The records since the last take."""
        records, self.records = self.records, []
        return records


def tick_kinds(ticks: list[Any]) -> str:
    """The ticks by kind as `bench --verbose` groups them (llamabatch/bench/trace.py), and apart
    from them the decodes stopped for an urgent arrival (nothing of them was kept)."""
    from llamabatch.bench.trace import trace_figures

    figures = trace_figures([r.to_dict() for r in ticks if not r.interrupted])
    parts = [f"{kind} {row['ticks']:.0f} ticks {row['ticks'] * row['mean_wall_ms'] / 1000:.2f} s "
             f"{row['mean_ubatches']:.2f} runs" for kind, row in figures.items() if kind != "all"]
    stopped = [r for r in ticks if r.interrupted]
    if stopped:
        parts.append(f"stopped {len(stopped)} ticks {sum(r.wall_ms for r in stopped) / 1000:.2f} s")
    return "; ".join(parts)


def server_completion(port: int, prompt: list[int], n: int, **fields: Any) -> dict:
    """One greedy llama-server /completion of token ids (prompt cache on), its JSON answer;
    `fields` adds to the body (ignore_eos, json_schema, ...)."""
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0.0, "cache_prompt": True,
                       **fields}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


@contextlib.contextmanager
def served(engine: Any, data_dir: str) -> Iterator[tuple[Any, int]]:
    """`llamabatch serve`'s app over `engine` on a free loopback port, from a thread of this
    process: (an openai client for it, the port). Closes the service, then the engine."""
    from openai import OpenAI

    from llamabatch.serve.http.app import build_app
    from llamabatch.serve.http.server import listen
    from llamabatch.serve.http.service import Service

    service = Service(engine, data_dir)
    listening = listen(build_app(service), "127.0.0.1", 0)
    service.start()
    thread = listening.run_in_thread()
    try:
        yield OpenAI(base_url=f"http://127.0.0.1:{listening.port}/v1", api_key="unused", max_retries=0,
                     timeout=3600), listening.port
    finally:
        listening.stop()
        thread.join(10)
        service.close(30)
        engine.close()
