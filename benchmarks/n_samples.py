"""n samples from one prefill vs the same samples sent as separate requests.

One engine, one process: P prompts of about 300 tokens, K samples of M tokens each
(temperature 1, seeds s, s+1, ...), run in rounds that alternate

  A: P requests with n=K      (one prefill per prompt, KV forked into K-1 more slots)
  B: P*K separate requests    (the same seeds: B's request i of a prompt = A's sample i)

Prefix sharing across slots is off (share_prefix_min=0) so B evaluates every prompt K times and
A once; the prefix cache stays on (n needs its full-size SWA cache to fork), so B gets part of
that back wherever a copy lands in a slot a finished copy of its prompt left behind. Every
request generates exactly M tokens (ignore_eos). Prints per round: wall seconds, prompt
tokens evaluated, the llama_decode time of ticks that evaluated prompt tokens, generated
tok/s; per pair the ratios A/B. It measures and prints; it never asserts on time.

  python benchmarks/n_samples.py [--prompts 8] [--n 4] [--tokens 32] [--rounds 2]
                                 [--slots 8] [--threads 2] [--model PATH] [--kv-unified]
"""
from __future__ import annotations

import argparse
import statistics

from _bench import machine_line, model_path, run_pairs, timed_generate, workload_args

from llamabatch import Engine, EngineConfig, SamplingParams

FACTS = ["the tide rises twice a day", "the lamp is lit at dusk", "the keeper writes in a log",
         "gulls nest on the rocks", "ships pass to the north", "the fog comes in autumn",
         "the stairs have ninety steps", "the lens was made in Paris"]


def make_prompt(i: int, engine: Engine, target: int = 300) -> str:
    parts = [f"Lighthouse report {i}."]
    j = 0
    while len(engine.tokenize(" ".join(parts))) < target:
        parts.append(f"Note {j}: {FACTS[(i + j) % len(FACTS)]}, as seen on day {i * 100 + j}.")
        j += 1
    return " ".join(parts) + " Summary of the report:"


def one_round(engine: Engine, prompts: list[str], params: SamplingParams, n: int, forked: bool) -> dict:
    if forked:
        run = timed_generate(engine, prompts, params.replace(n=n))
        texts = [s.text for r in run.results for s in r.samples]
    else:
        per = [params.replace(seed=params.seed + i) for _ in prompts for i in range(n)]
        run = timed_generate(engine, [p for p in prompts for _ in range(n)], per)
        texts = [r.text for r in run.results]
    assert not run.failed, [r.error for r in run.failed]
    return {"seconds": run.seconds, "prefill_tokens": sum(t.prefill_tokens for t in run.ticks),
            "prefill_eval_ms": sum(t.eval_ms for t in run.ticks if t.prefill_tokens),
            "tok_s": run.tok_s, "texts": texts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    workload_args(ap, prompts=8, tokens=32, rounds=2, slots=8, threads=2, model=True)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    ap.add_argument("--kv-unified", action="store_true",
                    help="one KV cache for all slots (a fork shares cells) instead of a stream per slot "
                         "(a fork copies the source's whole stream)")
    args = ap.parse_args()
    model = model_path(args.model)
    config = EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots,
                          threads=args.threads, share_prefix_min=0, kv_unified=args.kv_unified)
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, seed=42)
    with Engine(config) as engine:
        prompts = [make_prompt(i, engine) for i in range(args.prompts)]
        sizes = [len(engine.tokenize(p)) for p in prompts]
        print(f"{args.prompts} prompts of {min(sizes)}-{max(sizes)} tokens, n={args.n}, {args.tokens} tokens each, "
              f"{args.slots} slots, {args.threads} threads, KV {'unified' if args.kv_unified else 'a stream per slot'}, "
              f"prefix sharing off; rounds alternate A (n={args.n}) "
              f"and B ({args.prompts * args.n} separate requests); {machine_line(model)}")
        engine.generate(["warm up"], params.replace(max_tokens=4))  # untimed

        def report(r: int, a: dict, b: dict) -> None:
            for name, x in (("A forked  ", a), ("B separate", b)):
                print(f"round {r} {name} {x['seconds']:6.2f} s wall  prompt tokens evaluated {x['prefill_tokens']:5d}"
                      f"  prompt-tick decode {x['prefill_eval_ms'] / 1000:6.2f} s  {x['tok_s']:6.1f} generated tok/s")
            same = sum(x == y for x, y in zip(a["texts"], b["texts"]))
            print(f"round {r} A/B: wall x{a['seconds'] / b['seconds']:.3f}, prompt tokens "
                  f"x{a['prefill_tokens'] / b['prefill_tokens']:.3f}, prompt-tick time "
                  f"x{a['prefill_eval_ms'] / b['prefill_eval_ms']:.3f}; {same}/{len(a['texts'])} samples equal "
                  "their separate request")

        pairs = run_pairs(args.rounds, lambda: one_round(engine, prompts, params, args.n, forked=True),
                          lambda: one_round(engine, prompts, params, args.n, forked=False), report)
        print(f"median over {args.rounds} pairs: wall x{statistics.median(a['seconds'] / b['seconds'] for a, b in pairs):.3f}, "
              f"prompt tokens x{statistics.median(a['prefill_tokens'] / b['prefill_tokens'] for a, b in pairs):.3f}")


if __name__ == "__main__":
    main()
