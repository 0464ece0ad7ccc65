"""Throughput of the llamabatch engine against llama-cpp-python run one prompt at a time.

One workload, in one process: P prompts x M new tokens, greedy, T threads, through

  (a) llama-cpp-python's Llama.create_completion, one prompt after another
      (n_ctx=1024, one untimed warm-up call) - what a Python user has today;
  (b) the llamabatch Engine with N slots (1024 tokens of context each), per --slots value.

Both sides are made to generate the same number of tokens (the engine with ignore_eos; the
sequential side continues any completion that ends early with EOG banned), and tokens/s
comes from the completion tokens each side really reports. For the engine it also prints
the Python overhead per tick as a share of tick time, from the run's TickRecords, in two
definitions: (wall - llama_decode) / wall, and (wall - llama_decode - sampling) / wall.

It measures and prints; it never asserts on time. Usage:

  python benchmarks/engine_vs_sequential.py [--prompts 32] [--tokens 64] [--slots 8[,16]]
                                            [--threads 2] [--model PATH]
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from llamabatch import Engine, EngineConfig, SamplingParams, TickRecord
from llamabatch.models.resolve import check_gguf, resolve_model
from llamabatch.cli.bench.baseline import run_in_own_thread

SEQ_CTX = 1024  # the sequential Llama's context, and each engine slot's


def make_prompts(n: int) -> list[str]:
    # the same prompts as ../shared/tools/reference_throughput.py
    return [f"Question {i}: explain in a few sentences why the sky looks blue at noon and red at dusk."
            for i in range(n)]


def run_sequential(model: str, prompts: list[str], max_tokens: int, threads: int) -> tuple[int, float, int]:
    """(completion tokens, seconds, completions that had to be continued past an early EOG)."""
    import llama_cpp  # benchmarks may import llama_cpp; the library keeps it in runner.py

    from llamabatch.llama.cpu_kernels import llama_uses_model_params  # what the engine loads with (see there)

    with llama_uses_model_params(None, model):
        llm = llama_cpp.Llama(model_path=model, n_ctx=SEQ_CTX, n_threads=threads, n_threads_batch=threads,
                              verbose=False)
    try:
        llm.create_completion("warm up", max_tokens=4, temperature=0.0)
        eog_bias: dict[int, float] | None = None
        continued = 0
        total = 0
        t0 = time.perf_counter()
        for prompt in prompts:
            out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
            n = out["usage"]["completion_tokens"]
            if n < max_tokens:
                # Ended early on EOG. Continue with EOG banned so both sides generate the same
                # number of tokens (the ban runs as a Python logits processor, so it is only
                # used where needed; Llama reuses its cached prefix for the continuation).
                if eog_bias is None:
                    vocab = llm._model.vocab
                    eog_bias = {t: -math.inf for t in range(llm.n_vocab())
                                if llama_cpp.llama_vocab_is_eog(vocab, t)}
                more = llm.create_completion(prompt + out["choices"][0]["text"], max_tokens=max_tokens - n,
                                             temperature=0.0, logit_bias=eog_bias)
                n += more["usage"]["completion_tokens"]
                continued += 1
            total += n
        seconds = time.perf_counter() - t0
    finally:
        llm.close()
    return total, seconds, continued


def run_engine(model: str, prompts: list[str], max_tokens: int, threads: int, slots: int) -> dict:
    config = EngineConfig(model=model, n_parallel=slots, n_ctx=SEQ_CTX * slots, threads=threads)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with Engine(config) as engine:
        engine.generate(["warm up"], params.replace(max_tokens=4))  # untimed, like the sequential side
        ticks: list[TickRecord] = []
        unsubscribe = engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
        t0 = time.perf_counter()
        results = engine.generate(prompts, params)
        seconds = time.perf_counter() - t0
        unsubscribe()
    failed = [r for r in results if not r.ok]
    wall = sum(t.wall_ms for t in ticks)
    decode = sum(t.eval_ms for t in ticks)
    sample = sum(t.sample_ms for t in ticks)
    return {
        "tokens": sum(r.usage.completion_tokens for r in results),
        "seconds": seconds,
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "ticks": len(ticks),
        "tick_wall_ms": wall,
        "overhead_vs_decode": (wall - decode) / wall if wall else 0.0,
        "overhead_vs_decode_sample": (wall - decode - sample) / wall if wall else 0.0,
        "mean_tick_ms": wall / len(ticks) if ticks else 0.0,
        "mean_decode_tokens": sum(t.decode_tokens for t in ticks) / len(ticks) if ticks else 0.0,
        "outside_ticks": (seconds * 1000 - wall) / (seconds * 1000) if seconds else 0.0,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32, help="number of prompts (default 32)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--slots", default="8", help="engine slot counts, comma-separated (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads on both sides (default 2)")
    ap.add_argument("--model", default=None, help="GGUF file (default: the bundled Gemma 3 270M)")
    args = ap.parse_args(argv)
    try:
        args.slots = [int(s) for s in str(args.slots).split(",") if s.strip()]
    except ValueError:
        ap.error(f"--slots must be comma-separated integers, got {args.slots!r}")
    if not args.slots or min(args.slots) < 1 or args.prompts < 1 or args.tokens < 1 or args.threads < 1:
        ap.error("--prompts, --tokens, --threads and every --slots value must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = resolve_model(args.model)
    check_gguf(model)
    prompts = make_prompts(args.prompts)
    print(f"workload: {args.prompts} prompts x {args.tokens} new tokens, greedy, {args.threads} threads, "
          f"model {model}", flush=True)

    # On a thread of its own (see llamabatch.cli.bench.baseline.run_in_own_thread): an OpenMP team left on
    # the main thread by llama-cpp-python slowed the engine's decode ticks by ~20% here.
    n_seq, s_seq, continued = run_in_own_thread(run_sequential, model, prompts, args.tokens, args.threads)
    seq_tps = n_seq / s_seq
    note = f" ({continued} continued past an early EOG)" if continued else ""
    print(f"(a) llama-cpp-python sequential: {n_seq} tokens in {s_seq:.2f} s = {seq_tps:.1f} tok/s{note}", flush=True)

    for slots in args.slots:
        r = run_engine(model, prompts, args.tokens, args.threads, slots)
        tps = r["tokens"] / r["seconds"]
        print(f"(b) llamabatch engine, {slots} slots: {r['tokens']} tokens in {r['seconds']:.2f} s = {tps:.1f} tok/s"
              f"  -> {tps / seq_tps:.2f}x sequential", flush=True)
        print(f"    ticks: {r['ticks']}, mean {r['mean_tick_ms']:.1f} ms, "
              f"mean decode tokens per tick {r['mean_decode_tokens']:.2f}", flush=True)
        print(f"    python overhead per tick: (wall - llama_decode) / wall = {100 * r['overhead_vs_decode']:.2f}%; "
              f"(wall - decode - sampling) / wall = {100 * r['overhead_vs_decode_sample']:.2f}%", flush=True)
        print(f"    run time outside ticks (submit, thread wake-ups): {100 * r['outside_ticks']:.2f}%", flush=True)
        if r["tokens"] != n_seq:
            print(f"    note: token counts differ (engine {r['tokens']}, sequential {n_seq}); "
                  f"tok/s uses each side's real count", flush=True)
        if r["failed"]:
            print(f"    warning: {r['failed']} engine requests failed, first: {r['first_error']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
