"""What a q8_0 KV cache buys and costs against f16, in one run, A B A B:

1. KV bytes per slot, as llama.cpp itself counts them (its "llama_kv_cache: size" log lines,
   which the engine keeps as runner.capabilities.kv_mib), q8_0 / f16.
2. The most slots `--n-parallel auto` may take under one --max-memory (autoslots.bounds with
   this model's KV bytes per token in each type and its weights), q8_0 / f16.
3. Generated tokens/s at equal slots, q8_0 / f16 per A-B pair and their median, on uniform
   prompts (the sky questions) and on mixed prompt lengths (essays of 1 to 12 paragraphs).
4. Quality, reported and not asserted, for q8_0 and q4_0 against f16 on each --models model:
   the mean KL divergence of the next-token distribution (top --top-logprobs logprobs,
   renormalised) at the prompt's end and at 3 points of f16's greedy answer, and how many
   greedy answers of --tokens tokens are identical.

Every engine runs with flash attention "auto" (on for CPUs; a quantized V cache needs it).
It measures and prints; it never asserts on time. Usage:

  python benchmarks/kv_cache_types.py [--prompts 16] [--tokens 48] [--slots 8] [--rounds 2]
                                      [--threads 2] [--model PATH] [--max-memory 1GiB]
                                      [--models gemma,smollm2] [--top-logprobs 20]
                                      [--parts memory,throughput,quality]
"""
from __future__ import annotations

import argparse
import math
import statistics

from _bench import Pairs, essay_prompts, machine_line, model_path, run_pairs, say, sky_prompts, timed_generate, \
    workload_args

from llamabatch import Engine, EngineConfig, SamplingParams

SLOT_CTX = 2048
QUALITY_TYPES = ("q8_0", "q4_0")


def types_of(name: str) -> dict[str, str]:
    return {"cache_type_k": name, "cache_type_v": name}


def mixed_prompts(n: int) -> list[str]:
    """n prompts of 1 to 12 essay paragraphs: prefill and decode of different lengths side by side."""
    paragraph = ("The committee met again on Tuesday to review the budget, the timetable and the list of "
                 "open questions about the new library building, and it agreed on most of them. ")
    return [paragraph * (1 + (i * 5) % 12) + opening for i, opening in enumerate(essay_prompts(n))]


def throughput(model: str, name: str, slots: int, prompts: list[str], tokens: int, threads: int) -> tuple[float, float]:
    """(generated tokens/s, KV MiB per slot as llama.cpp allocated it) for generate(prompts)."""
    config = EngineConfig(model=model, n_parallel=slots, n_ctx=SLOT_CTX * slots, threads=threads,
                          cache_prompt=False, **types_of(name))
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    with Engine(config) as engine:
        engine.generate(["warm up"], SamplingParams(max_tokens=2, temperature=0.0))
        run = timed_generate(engine, prompts, params)
        kv_mib = engine.runner.capabilities.kv_mib
    if run.failed:
        raise SystemExit(f"{len(run.failed)} request(s) failed, first: {run.failed[0].error}")
    return run.tok_s, kv_mib / slots


def auto_bound(model: str, name: str, max_memory: str, threads: int) -> tuple[int, str]:
    """The most slots n_parallel auto may choose under max_memory with this cache type."""
    from llamabatch.llama import autoslots
    from llamabatch.models.gguf_header import read_header
    from llamabatch.kernel_paths.resources import kv_bytes_per_token, weights_size

    config = EngineConfig(model=model, n_parallel="auto", threads=threads, max_memory=max_memory, **types_of(name))
    per_token = kv_bytes_per_token(read_header(model).metadata, name, name)
    return autoslots.bounds(config, per_token, autoslots.available_memory(), None, weights_size(model))


# -- quality ----------------------------------------------------------------------------------

def _distribution(top: list[dict], ids: list[int], floor: float) -> list[float]:
    """Probabilities of `ids` from a top-logprobs list (a token outside it gets `floor`, the
    list's smallest logprob: an upper bound), renormalised over `ids`."""
    by_id = {t["id"]: t["logprob"] for t in top}
    weights = [math.exp(by_id.get(i, floor)) for i in ids]
    total = sum(weights)
    return [w / total for w in weights]


def kl_divergence(reference: list[dict], other: list[dict]) -> float:
    """KL(reference || other) over the reference's top tokens."""
    ids = [t["id"] for t in reference]
    p = _distribution(reference, ids, min(t["logprob"] for t in reference))
    q = _distribution(other, ids, min(t["logprob"] for t in other))
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def quality_run(model: str, name: str, prompts: list[str], tokens: int, top: int, threads: int,
                probes: list[str] | None) -> tuple[list[str], list[list[dict]]]:
    """(greedy answers, next-token top logprobs at each probe text) with cache type `name`."""
    config = EngineConfig(model=model, n_parallel=4, n_ctx=4 * SLOT_CTX, threads=threads, cache_prompt=False,
                          **types_of(name))
    with Engine(config) as engine:
        answers = engine.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
        texts = [r.text for r in answers]
        probe_texts = probes if probes is not None else [p + t[:len(t) * j // 4] for p, t in zip(prompts, texts)
                                                         for j in range(4)]
        # ignore_eos: an end-of-text token is a next token like any other, and must keep its logprobs
        nexts = engine.generate(probe_texts, SamplingParams(max_tokens=1, temperature=0.0, logprobs=top,
                                                            ignore_eos=True))
    return texts, [r.logprobs[0]["top_logprobs"] for r in nexts], probe_texts


def quality(model: str, prompts: list[str], tokens: int, top: int, threads: int) -> list[str]:
    f16_texts, f16_tops, probes = quality_run(model, "f16", prompts, tokens, top, threads, None)
    lines = []
    for name in QUALITY_TYPES:
        texts, tops, _ = quality_run(model, name, prompts, tokens, top, threads, probes)
        kl = statistics.mean(kl_divergence(a, b) for a, b in zip(f16_tops, tops))
        same = sum(a == b for a, b in zip(f16_texts, texts))
        top1 = sum(a[0]["id"] == b[0]["id"] for a, b in zip(f16_tops, tops))
        lines.append(f"  {name}/{name} vs f16: mean KL {kl:.5f} nats over {len(probes)} next-token distributions "
                     f"(top-1 agrees at {top1}/{len(probes)}); identical greedy answers {same}/{len(prompts)}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap, prompts=16, tokens=48, slots=8, rounds=2, threads=2, model=True)
    ap.add_argument("--max-memory", default="1GiB", help="the --max-memory auto slots are bounded by (default 1GiB)")
    ap.add_argument("--models", default="gemma,smollm2",
                    help="models for the quality figures, comma-separated (default gemma,smollm2)")
    ap.add_argument("--top-logprobs", type=int, default=20, help="logprobs per position for the KL (default 20)")
    ap.add_argument("--parts", default="memory,throughput,quality",
                    help="what to measure, comma-separated (default memory,throughput,quality)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    model = model_path(args.model)
    print(f"KV cache q8_0/q8_0 against f16/f16, flash attention auto; {args.slots} slots x {SLOT_CTX} tokens, "
          f"{args.threads} threads; {machine_line(model)}", flush=True)

    if "memory" in parts:
        memory_figures(model, args)
    if "throughput" in parts:
        throughput_figures(model, args)
    if "quality" in parts:
        quality_figures(args)


def memory_figures(model: str, args: argparse.Namespace) -> None:
    bound = {name: auto_bound(model, name, args.max_memory, args.threads) for name in ("f16", "q8_0")}
    print(f"auto slots under --max-memory {args.max_memory}: f16 {bound['f16'][0]} ({bound['f16'][1] or 'no bound'}), "
          f"q8_0 {bound['q8_0'][0]} ({bound['q8_0'][1] or 'no bound'}); ratio "
          f"{bound['q8_0'][0] / bound['f16'][0]:.2f}x", flush=True)

    kv = {name: throughput(model, name, args.slots, ["warm up"], 2, args.threads)[1] for name in ("f16", "q8_0")}
    print(f"KV per slot (llama.cpp's count, {SLOT_CTX} tokens, no prompt cache so Gemma's window layers keep "
          f"only the window): f16 {kv['f16']:.2f} MiB, q8_0 {kv['q8_0']:.2f} MiB; ratio {kv['q8_0'] / kv['f16']:.3f}x",
          flush=True)


def throughput_figures(model: str, args: argparse.Namespace) -> None:
    workloads = {"uniform": sky_prompts(args.prompts), "mixed lengths": mixed_prompts(args.prompts)}
    summary = []
    for label, prompts in workloads.items():
        pairs = Pairs()

        def run(name: str, prompts: list[str] = prompts) -> float:
            return throughput(model, name, args.slots, prompts, args.tokens, args.threads)[0]

        def report(r: int, a: float, b: float, label: str = label, pairs: Pairs = pairs) -> None:
            print(f"{label} round {r}: f16 {a:7.1f} tok/s   q8_0 {b:7.1f} tok/s   ratio {pairs.add(a, b):.3f}",
                  flush=True)

        run_pairs(args.rounds, lambda: run("f16"), lambda: run("q8_0"), report)
        summary.append((label, pairs.median()))
    print("median q8_0/f16 throughput at equal slots: " + ", ".join(f"{label} {m:.3f}" for label, m in summary))


def quality_figures(args: argparse.Namespace) -> None:
    for name in [m for m in args.models.split(",") if m]:
        say(f"quality: {name}")
        print(f"quality on {name} ({args.prompts} sky questions, {args.tokens} greedy tokens, "
              f"top {args.top_logprobs} logprobs):")
        for line in quality(model_path(name), sky_prompts(args.prompts), args.tokens, args.top_logprobs,
                            args.threads):
            print(line, flush=True)


if __name__ == "__main__":
    main()
