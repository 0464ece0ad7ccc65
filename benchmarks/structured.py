"""Structured output (JSON schemas as llguidance token masks) side by side, in one process run.

Three modes; each measures and prints (figures on stdout, progress on stderr), never asserts on time.

default — constrained against unconstrained, on each model of -m (default: gemma,smollm2):
  N lines of tests/structured_schemas.py's extraction file (20 schemas, chat prompts),
  greedy, 8 slots, alternating A B A B, each run on a fresh engine (model load and one untimed
  constrained warm-up request, which builds llguidance's tokenizer, are not timed):
    A  constrained: each line with its json_schema, grammar_backend auto (llguidance masks)
    B  unconstrained: the same prompts, no schema, max_tokens = that line's completion tokens in
       A's first run and ignore_eos (the same token counts)
    C  the same constrained lines with grammar_backend llama (llama.cpp's GBNF sampler), in the
       first --llama-rounds rounds (slow on Gemma's 262k vocabulary; --skip-llama-backend)
  Prints generated tok/s, ticks (eval / sample / overhead ms a tick), forced tokens and valid
  answers per run; A/B and C/B per pair (issue targets: A/B >= 0.9 on Gemma, >= 0.95 on SmolLM2).

--server — against llama.cpp's llama-server (-np 8 --swa-full, built once and cached by
  ../shared/tools/build-llama-cpp-tools.sh under ~/.cache/llamabatch-anchors, with nice -n 19):
  the same lines as token ids (rendered with the engine's chat template) sent to /completion with
  `json_schema`, --clients concurrent requests, against the Engine on the same token ids and
  schemas; wall seconds per run and server/engine per pair (issue target >= 2).

--masks — micro-figures per model: llguidance's tokenizer built from the GGUF's vocabulary, a
  {name, age, city} schema compiled, the mask computed at each step of an answer (median, max
  µs), the mask applied to a logits row (Matcher.mask_row with the mask already computed), and a
  10,000-string enum line submitted beside plain lines: submit to its first token, and the plain
  lines' tok/s with it against without it, alternating (issue targets: first mask within 1 s;
  plain lines <= 1.1x slower).

Usage:
  python benchmarks/structured.py [-m gemma,smollm2] [--lines 32] [--slots 8] [--rounds 2]
      [--skip-schemas NAME,...] [--skip-llama-backend] [--llama-rounds 1]
      [--server [--bin DIR] [--clients 8]] [--masks [--enum-size 10000] [--enum-at first|last]]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _bench import Pairs, machine_line, model_path, say, server_completion, sky_prompts, timed_generate

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.results import Delta, Result

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / ".." / "shared" / "tools" / "build-llama-cpp-tools.sh"


def _load_schemas():
    """tests/structured_schemas.py, imported by its path (the tests' own schema set and prompts)."""
    spec = importlib.util.spec_from_file_location("structured_schemas", ROOT / "tests" / "structured_schemas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCHEMAS_MODULE = _load_schemas()
SCHEMAS: dict[str, dict] = SCHEMAS_MODULE.SCHEMAS
PERSON = SCHEMAS["person"]
WARM_UP = [{"role": "user", "content": "Give a person as JSON."}]


def extraction_lines(args) -> list[tuple[str, list[dict]]]:
    """`--lines` lines of the tests' extraction file, leaving out the schemas of --skip-schemas."""
    skip = {x.strip() for x in args.skip_schemas.split(",") if x.strip()}
    unknown = skip - set(SCHEMAS)
    if unknown:
        raise SystemExit(f"--skip-schemas: no schema named {', '.join(sorted(unknown))} (there are {', '.join(SCHEMAS)})")
    if skip >= set(SCHEMAS):
        raise SystemExit("--skip-schemas leaves no schema")
    work, n = [], args.lines
    while len(work) < args.lines:
        work = [w for w in SCHEMAS_MODULE.lines(n) if w[0] not in skip][:args.lines]
        n *= 2
    return work


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except Exception:
        return False
    return True


# -- one engine run ---------------------------------------------------------------------------

@dataclass
class Run:
    system: str
    tokens: int
    seconds: float
    counts: list[int] = field(default_factory=list)  # completion tokens per line
    ticks: int = 0
    eval_ms: float = 0.0  # per tick, means
    sample_ms: float = 0.0
    overhead_ms: float = 0.0
    forced: int = 0
    valid: int | None = None
    lines: int = 0
    finish: dict[str, int] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def engine_config(model: str, args, backend: str = "auto") -> EngineConfig:
    """The same config for every side: prefix store off (the default), the same n_ctx."""
    return EngineConfig(model=model, n_parallel=args.slots, n_ctx=args.slots * args.slot_ctx, threads=args.threads,
                        grammar_backend=backend)


def engine_run(system: str, model: str, args, backend: str, prompts: list, params: list[SamplingParams],
               schemas: list[dict | None], allow_failed: bool = False, names: list[str] | None = None) -> Run:
    """A fresh engine, an untimed constrained warm-up (llguidance's tokenizer is built once a
    model), then generate() over every line, timed."""
    with Engine(engine_config(model, args, backend)) as engine:
        engine.generate([WARM_UP], SamplingParams(max_tokens=8, temperature=0, json_schema=PERSON))
        forced_before = engine.stats().forced_tokens
        run = timed_generate(engine, prompts, params)
        forced = engine.stats().forced_tokens - forced_before
    failed = run.failed
    if failed and not allow_failed:
        raise SystemExit(f"{system}: {len(failed)} lines failed, first: {failed[0].error}")
    for error in sorted({r.error for r in failed}):
        say(f"   {system}: {sum(r.error == error for r in failed)} lines failed: {error}")
    out = Run(system, run.generated, run.seconds, [r.usage.completion_tokens for r in run.results], forced=forced,
              lines=len(run.results))
    for r in run.results:
        out.finish[r.finish_reason] = out.finish.get(r.finish_reason, 0) + 1
    if any(s is not None for s in schemas):
        out.valid = sum(valid(r.text, s) for r, s in zip(run.results, schemas) if s is not None)
        for i, (r, s) in enumerate(zip(run.results, schemas)):
            if s is not None and r.ok and not valid(r.text, s):
                say(f"   {system}: line {i} ({names[i] if names else '?'}) does not validate, {r.finish_reason} after "
                    f"{r.usage.completion_tokens} tokens: {r.text[:120]!r}")
    if run.ticks:
        n = len(run.ticks)
        out.ticks = n
        out.eval_ms = sum(t.eval_ms for t in run.ticks) / n
        out.sample_ms = sum(t.sample_ms for t in run.ticks) / n
        out.overhead_ms = sum(t.overhead_ms for t in run.ticks) / n
    return out


def run_row(r: Run, pair: int) -> str:
    valid_cell = f"{r.valid}/{r.lines}" if r.valid is not None else ""
    finish = ", ".join(f"{k} {v}" for k, v in sorted(r.finish.items()))
    return (f"| {pair} | {r.system} | {r.tokens} | {r.seconds:.2f} | {r.tok_s:.1f} | {r.ticks} | {r.eval_ms:.1f} | "
            f"{r.sample_ms:.2f} | {r.overhead_ms:.2f} | {r.forced} | {valid_cell} | {finish} |")


# -- mode 1: constrained against unconstrained -----------------------------------------------------

def constrained_vs_plain(name: str, model: str, args) -> None:
    work = extraction_lines(args)
    prompts = [messages for _, messages in work]
    schemas = [SCHEMAS[s] for s, _ in work]
    names = [s for s, _ in work]
    constrained = [SamplingParams(max_tokens=args.max_tokens, temperature=0, json_schema=s) for s in schemas]
    print(f"## {name}: {Path(model).name}, {args.lines} extraction lines over {len(set(s for s, _ in work))} schemas"
          f"{f' (without {args.skip_schemas})' if args.skip_schemas else ''}, "
          f"greedy, {args.slots} slots, {args.threads} threads, {args.slot_ctx} ctx a slot\n")
    print(f"{machine_line(model)}\n")
    print("| pair | system | tokens | seconds | tok/s | ticks | eval ms/tick | sample ms/tick | overhead ms/tick | "
          "forced tokens | valid | finish |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    a_over_b, c_over_b = Pairs(), Pairs()
    counts: list[int] | None = None
    lines_out: list[str] = []
    for pair in range(1, args.rounds + 1):
        say(f"== {name} pair {pair}: A constrained (llguidance)")
        a = engine_run("A constrained, auto (llguidance)", model, args, "auto", prompts, constrained, schemas,
                       names=names)
        if counts is None:
            counts = a.counts  # B generates what A's first run did, line by line
        elif a.counts != counts:
            say(f"   note: A's token counts changed from pair 1 ({sum(counts)} -> {sum(a.counts)} tokens)")
        print(run_row(a, pair), flush=True)
        say(f"   A: {a.tokens} tokens in {a.seconds:.2f} s, {a.tok_s:.1f} tok/s, {a.forced} forced")
        say(f"== {name} pair {pair}: B unconstrained, same token counts")
        plain = [SamplingParams(max_tokens=max(n, 1), temperature=0, ignore_eos=True) for n in counts]
        b = engine_run("B unconstrained, same counts", model, args, "auto", prompts, plain, [None] * len(prompts))
        print(run_row(b, pair), flush=True)
        say(f"   B: {b.tokens} tokens in {b.seconds:.2f} s, {b.tok_s:.1f} tok/s")
        lines_out.append(f"- pair {pair}: A/B {a_over_b.add(b.tok_s, a.tok_s):.2f}")
        if not args.skip_llama_backend and pair <= args.llama_rounds:
            say(f"== {name} pair {pair}: C constrained (llama.cpp GBNF sampler)")
            c = engine_run("C constrained, llama (GBNF sampler)", model, args, "llama", prompts, constrained, schemas,
                           allow_failed=True, names=names)
            print(run_row(c, pair), flush=True)
            say(f"   C: {c.tokens} tokens in {c.seconds:.2f} s, {c.tok_s:.1f} tok/s")
            lines_out[-1] += f", C/B {c_over_b.add(b.tok_s, c.tok_s):.2f}, C/A {c.tok_s / a.tok_s:.2f}"
    print()
    print("Generated tok/s ratios per pair (A B [C] in that order each pair):\n")
    print("\n".join(lines_out))
    print(f"- median A/B over {len(a_over_b.ratios)} pairs: {a_over_b.median():.2f}"
          + (f"; C/B: {c_over_b.median():.2f}" if c_over_b.ratios else ""))
    print(flush=True)


# -- mode 2: against llama-server ----------------------------------------------------------------

def server_bin(args) -> Path:
    if args.bin:
        return Path(args.bin)
    say("== building (or finding, cached) llama-server: nice -n 19 ../shared/tools/build-llama-cpp-tools.sh")
    out = subprocess.run(["nice", "-n", "19", "bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the llama.cpp tools build failed ({out.returncode}): {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def token_prompts(model: str, args, work) -> list[list[int]]:
    """The lines as the engine would evaluate them: its chat template, then its tokenizer."""
    with Engine(EngineConfig(model=model, n_parallel=1, n_ctx=args.slot_ctx, threads=args.threads)) as engine:
        return [engine.tokenize(engine.render_chat(messages), special=True) for _, messages in work]


def server_complete(port: int, prompt: list[int], schema: dict, n: int) -> tuple[int, str]:
    out = server_completion(port, prompt, n, json_schema=schema)
    return out["tokens_predicted"], out["content"]


def server_run(binary: Path, model: str, args, prompts: list[list[int]], schemas: list[dict],
               names: list[str]) -> Run:
    from vs_llama_server import Server  # its start, health wait and stop; the kernels flags of the engine's

    extra = ["-np", str(args.slots), "-c", str(args.slots * args.slot_ctx), "--swa-full"]
    with Server(str(binary / "llama-server"), model, args.threads, extra) as server:
        server_complete(server.port, prompts[0], PERSON, 8)  # untimed warm-up
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(args.clients) as pool:
            answers = list(pool.map(lambda ps: server_complete(server.port, ps[0], ps[1], args.max_tokens),
                                    zip(prompts, schemas)))
        seconds = time.perf_counter() - t0
    out = Run("llama-server -np 8 --swa-full, json_schema", sum(n for n, _ in answers), seconds,
              [n for n, _ in answers], lines=len(answers))
    out.valid = sum(valid(text, s) for (_, text), s in zip(answers, schemas))
    for i, ((n, text), s) in enumerate(zip(answers, schemas)):
        if not valid(text, s):
            say(f"   llama-server: line {i} ({names[i]}) does not validate after {n} tokens: {text[:120]!r}")
    return out


def engine_vs_server(name: str, model: str, args, binary: Path) -> None:
    work = extraction_lines(args)
    schemas = [SCHEMAS[s] for s, _ in work]
    prompts = token_prompts(model, args, work)
    constrained = [SamplingParams(max_tokens=args.max_tokens, temperature=0, json_schema=s) for s in schemas]
    from vs_llama_server import same_kernels

    print(f"## {name} against llama-server: {Path(model).name}, {args.lines} extraction lines as token ids"
          f"{f' (without {args.skip_schemas})' if args.skip_schemas else ''} "
          f"({sum(map(len, prompts))} prompt tokens), greedy, json_schema on both sides, {args.slots} slots each, "
          f"{args.clients} concurrent requests to the server, {args.threads} threads a side; server flags: -np "
          f"{args.slots} -c {args.slots * args.slot_ctx} --swa-full {' '.join(same_kernels(model))}\n")
    print(f"{machine_line(model)}\n")
    print("| pair | system | tokens | wall s | tok/s | valid |\n|---|---|---|---|---|---|")
    ratios = Pairs()
    notes = []
    for pair in range(1, args.rounds + 1):
        say(f"== {name} pair {pair}: llama-server")
        s = server_run(binary, model, args, prompts, schemas, [n for n, _ in work])
        print(f"| {pair} | {s.system} | {s.tokens} | {s.seconds:.2f} | {s.tok_s:.1f} | {s.valid}/{s.lines} |", flush=True)
        say(f"   server: {s.tokens} tokens in {s.seconds:.2f} s")
        say(f"== {name} pair {pair}: engine")
        e = engine_run("engine, json_schema (llguidance)", model, args, "auto", prompts, constrained, schemas,
                       names=[n for n, _ in work])
        print(f"| {pair} | {e.system} | {e.tokens} | {e.seconds:.2f} | {e.tok_s:.1f} | {e.valid}/{e.lines} |", flush=True)
        say(f"   engine: {e.tokens} tokens in {e.seconds:.2f} s")
        notes.append(f"- pair {pair}: server wall / engine wall {ratios.add(e.seconds, s.seconds):.2f} "
                     f"(generated tok/s engine / server {e.tok_s / s.tok_s:.2f})")
    print("\n" + "\n".join(notes))
    print(f"- median server wall / engine wall over {len(ratios.ratios)} pairs: {ratios.median():.2f}\n", flush=True)


# -- mode 3: mask micro-figures and the 10,000-string enum ------------------------------------------

def vocabulary(model: str):
    """The model's vocabulary alone (llama.cpp vocab_only), as the mask tests load it."""
    from llamabatch.errors import ModelLoadError
    from llamabatch.llama.direct_load import load_vocabulary
    from llamabatch.llama.vocab import Vocabulary

    try:
        handle = load_vocabulary(model)
    except ModelLoadError as exc:
        raise SystemExit(str(exc)) from None
    return Vocabulary(handle), handle


class _Computed:
    """Stands in for the llguidance matcher inside a Matcher whose mask is already computed, so
    that mask_row times the apply alone (everything else goes to the real matcher)."""

    def __init__(self, real: Any):
        self.real = real

    def unsafe_compute_mask_ptr(self, ptr: int, size: int) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def us(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f} µs ({max(values) * 1e6:.0f} µs)"


def mask_figures(name: str, model: str, args) -> dict[str, str]:
    import numpy as np
    from llama_cpp import llama_cpp as C

    from llamabatch.llama.sampling.mask_grammar import MaskGrammars, Matcher

    vocab, handle = vocabulary(model)
    try:
        builds = []
        for _ in range(args.mask_reps):
            masks = MaskGrammars(vocab, "llguidance")
            t0 = time.perf_counter()
            masks.tokenizer()
            builds.append(time.perf_counter() - t0)
        say(f"   {name}: tokenizer built in {', '.join(f'{b:.2f}' for b in builds)} s")
        compiles, copies = [], []
        for _ in range(20):
            masks._compiled.clear()  # a compile each time, not the cache
            t0 = time.perf_counter()
            masks.matcher_for(None, PERSON)
            compiles.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            masks.matcher_for(None, PERSON)  # from the cache: a deep copy of the compiled matcher
            copies.append(time.perf_counter() - t0)
        answer = '{"name": "Ada Lovelace", "age": 36, "city": "London"}'
        tokens = masks.tokenizer().tokenize_str(answer)
        rng = np.random.default_rng(0)
        base = rng.standard_normal(vocab.n_tokens).astype(np.float32)
        computes, applies, allowed_counts = [], [], []
        forced_steps = 0
        for _ in range(args.mask_reps):
            m = masks.matcher_for(None, PERSON)
            applier = Matcher.__new__(Matcher)
            applier.matcher, applier.n_vocab, applier.words = _Computed(m.matcher), m.n_vocab, m.words
            for tok in tokens:
                t0 = time.perf_counter()
                m.matcher.unsafe_compute_mask_ptr(m.words.ctypes.data, m.words.nbytes)
                computes.append(time.perf_counter() - t0)
                row = base.copy()
                t0 = time.perf_counter()
                applier.mask_row(row)
                applies.append(time.perf_counter() - t0)
                allowed = int(np.isfinite(row).sum())
                allowed_counts.append(allowed)
                forced_steps += allowed == 1
                if not np.isfinite(row[tok]):
                    raise SystemExit(f"{name}: the mask forbids token {tok} of the answer {answer!r}")
                m.accept(tok)
        few = [a for a, n in zip(applies, allowed_counts) if n * 8 < vocab.n_tokens]
        many = [a for a, n in zip(applies, allowed_counts) if n * 8 >= vocab.n_tokens]
        apply_cell = us(applies)
        if few and many:
            apply_cell += f"; few tokens allowed {us(few)}, many {us(many)}"
        return {
            "vocabulary": f"{vocab.n_tokens:,} tokens",
            "tokenizer built from the GGUF's vocabulary (once a model)":
                f"{statistics.median(builds):.2f} s (runs: {', '.join(f'{b:.2f}' for b in builds)})",
            "a {name, age, city} schema compiled (once a schema), median (max) of 20":
                f"{statistics.median(compiles) * 1e3:.2f} ms ({max(compiles) * 1e3:.2f} ms)",
            "a request's matcher from the compiled cache (deep copy), median (max)": us(copies),
            f"a mask, median (max) over one answer ({len(tokens)} steps x {args.mask_reps})": us(computes),
            "applying it to the logits row (mask_row, mask already computed), median (max)": apply_cell,
            "steps where one token was allowed (forced in the engine)": f"{forced_steps // args.mask_reps} of {len(tokens)}",
        }
    finally:
        C.llama_model_free(handle)


def enum_schema(size: int, tag: int) -> dict:
    return {"type": "object", "properties": {"code": {"enum": [f"product {tag}-{i:05d}" for i in range(size)]}},
            "required": ["code"], "additionalProperties": False}


@dataclass
class EnumRun:
    plain_tokens: int
    plain_seconds: float  # first submit -> last plain line done
    submit_s: float | None = None  # the enum line's submit() call (its schema compiled there)
    first_token_s: float | None = None  # the enum line's submit -> its first token
    text: str = ""

    @property
    def plain_tok_s(self) -> float:
        return self.plain_tokens / self.plain_seconds


def enum_run(model: str, args, with_enum: bool, tag: int) -> EnumRun:
    plain_prompts = sky_prompts(args.plain_lines)
    plain = SamplingParams(max_tokens=args.plain_tokens, temperature=0, ignore_eos=True)
    done: list[float] = []
    first: list[float] = []
    lock = threading.Lock()

    def on_plain(handle, event) -> None:
        if isinstance(event, Result):
            with lock:
                done.append(time.perf_counter())

    def on_enum(handle, event) -> None:
        if not first and isinstance(event, Delta) and event.token_ids:
            first.append(time.perf_counter())

    with Engine(engine_config(model, args)) as engine:
        engine.generate([WARM_UP], SamplingParams(max_tokens=8, temperature=0, json_schema=PERSON))
        schema = enum_schema(args.enum_size, tag)
        handles = []
        t0 = time.perf_counter()
        submit_s = None
        if with_enum and args.enum_at == "first":
            enum_handle = engine.submit([{"role": "user", "content": "Pick one product code."}],
                                        SamplingParams(max_tokens=32, temperature=0, json_schema=schema),
                                        callback=on_enum)
            submit_s = time.perf_counter() - t0
        for p in plain_prompts:
            handles.append(engine.submit(p, plain, callback=on_plain))
        if with_enum and args.enum_at == "last":
            t_enum = time.perf_counter()
            enum_handle = engine.submit([{"role": "user", "content": "Pick one product code."}],
                                        SamplingParams(max_tokens=32, temperature=0, json_schema=schema),
                                        callback=on_enum)
            submit_s = time.perf_counter() - t_enum
        results = [h.result(timeout=3600) for h in handles]
        t_plain = max(done) if len(done) == len(handles) else time.perf_counter()
        out = EnumRun(sum(r.usage.completion_tokens for r in results), t_plain - t0)
        if with_enum:
            enum_result = enum_handle.result(timeout=3600)
            if not enum_result.ok:
                raise SystemExit(f"the enum line failed: {enum_result.error}")
            start = t0 if args.enum_at == "first" else t_enum
            out.submit_s = submit_s
            out.first_token_s = (first[0] - start) if first else None
            out.text = enum_result.text
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"{len(bad)} plain lines failed, first: {bad[0].error}")
    return out


def masks_mode(name: str, model: str, args) -> None:
    say(f"== {name}: mask micro-figures")
    figures = mask_figures(name, model, args)
    print(f"## {name}: llguidance masks, {Path(model).name}\n")
    print(f"{machine_line(model)}\n")
    print("| | figure |\n|---|---|")
    for k, v in figures.items():
        print(f"| {k} | {v} |")
    print(flush=True)
    if args.enum_size <= 0:
        return
    print(f"### {name}: a {args.enum_size:,}-string enum line submitted {args.enum_at} beside {args.plain_lines} plain "
          f"lines x {args.plain_tokens} tokens (ignore_eos), {args.slots} slots, A with it, B without, alternating\n")
    print("| pair | run | plain tokens | plain s | plain tok/s | enum submit() s | enum submit -> first token s |")
    print("|---|---|---|---|---|---|---|")
    pairs = Pairs()
    notes = []
    for pair in range(1, args.rounds + 1):
        say(f"== {name} enum pair {pair}: A with the enum line")
        a = enum_run(model, args, True, pair)
        say(f"   A: plain {a.plain_tok_s:.1f} tok/s, enum submit {a.submit_s:.3f} s, first token "
            f"{a.first_token_s if a.first_token_s is None else round(a.first_token_s, 3)} s, answer {a.text!r}")
        print(f"| {pair} | A with the enum | {a.plain_tokens} | {a.plain_seconds:.2f} | {a.plain_tok_s:.1f} | "
              f"{a.submit_s:.3f} | {a.first_token_s if a.first_token_s is None else f'{a.first_token_s:.3f}'} |",
              flush=True)
        say(f"== {name} enum pair {pair}: B plain lines alone")
        b = enum_run(model, args, False, pair)
        print(f"| {pair} | B without | {b.plain_tokens} | {b.plain_seconds:.2f} | {b.plain_tok_s:.1f} | | |", flush=True)
        notes.append(f"- pair {pair}: plain lines' time with / without the enum line "
                     f"{pairs.add(b.plain_seconds, a.plain_seconds):.2f}x")
    print("\n" + "\n".join(notes))
    print(f"- median over {len(pairs.ratios)} pairs: {pairs.median():.2f}x (target <= 1.1x)\n", flush=True)


# -- main -------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="gemma,smollm2",
                    help="models, comma-separated: paths or names `llamabatch -m` takes (default: gemma,smollm2)")
    ap.add_argument("--lines", type=int, default=32, help="extraction lines (default 32)")
    ap.add_argument("--slots", type=int, default=8, help="engine slots, and llama-server's -np (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs (default 2)")
    ap.add_argument("--slot-ctx", type=int, default=1024, help="context tokens a slot, every side (default 1024)")
    ap.add_argument("--skip-schemas", default="",
                    help="schemas of tests/structured_schemas.py to leave out, comma-separated (default: none)")
    ap.add_argument("--max-tokens", type=int, default=256, help="a constrained line's max_tokens (default 256)")
    ap.add_argument("--skip-llama-backend", action="store_true", help="no C runs (llama.cpp's GBNF sampler)")
    ap.add_argument("--llama-rounds", type=int, default=1, help="pairs that also run C (default 1)")
    ap.add_argument("--server", action="store_true", help="against llama-server instead of the default mode")
    ap.add_argument("--bin", help="folder with llama-server [default: build it once, cached]")
    ap.add_argument("--clients", type=int, default=8, help="--server: concurrent requests (default 8)")
    ap.add_argument("--masks", action="store_true", help="mask micro-figures and the enum line instead of the default mode")
    ap.add_argument("--mask-reps", type=int, default=3, help="--masks: tokenizer builds and answer walks (default 3)")
    ap.add_argument("--enum-size", type=int, default=10_000, help="--masks: strings in the enum (0: skip; default 10000)")
    ap.add_argument("--enum-at", choices=["first", "last"], default="first",
                    help="--masks: submit the enum line before or after the plain lines (default first)")
    ap.add_argument("--plain-lines", type=int, default=16, help="--masks: plain lines beside the enum (default 16)")
    ap.add_argument("--plain-tokens", type=int, default=32, help="--masks: tokens a plain line (default 32)")
    args = ap.parse_args()
    for name in ("lines", "slots", "threads", "rounds", "slot_ctx", "max_tokens", "clients", "mask_reps",
                 "plain_lines", "plain_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    names = [m.strip() for m in args.model.split(",") if m.strip()]
    if not names:
        ap.error("-m names no model")
    models = [(n, model_path(n)) for n in names]

    print(f"# structured output: {shlex.join(['python', 'benchmarks/structured.py', *sys.argv[1:]])}\n")
    print(f"{machine_line()}; figures are noisy: compare ratios per pair\n", flush=True)
    binary = server_bin(args) if args.server else None
    for name, model in models:
        if args.masks:
            masks_mode(name, model, args)
        if binary is not None:
            engine_vs_server(name, model, args, binary)
        if not args.masks and not args.server:
            constrained_vs_plain(name, model, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
