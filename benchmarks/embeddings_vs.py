"""Embeddings: llamabatch's engine against llama-server and llama-cpp-python's Llama.embed,
side by side in one process run, on the same inputs.

Inputs: N texts of 10..200 tokens (seeded), tokenized once; the engine and llama-server get
those token ids, Llama.embed the texts (it tokenizes them the same way: BOS, no special
parsing). Systems, every one mean-pooled, each run in turn, A B C A B C ...:

  engine       the llamabatch Engine: engine.embed(all inputs) (n_batch = --batch)
  server       llama-server --embeddings --pooling mean --kv-unified -np --server-slots
               -c (slots x 256) -b/-ub --batch, the inputs sent as /v1/embeddings requests of
               --chunk inputs from --clients concurrent clients
  llama.embed  Llama(embedding=True, pooling mean, n_batch = n_ubatch = --batch).embed(texts)

--batch (default 512, llama-server's and Llama's own default) is the tokens per llama_decode
everywhere. Why --kv-unified and n_ubatch = n_batch: llama.cpp pools per graph run (ubatch),
so a sequence split over two graph runs is pooled over its last part only. llama-server
sets -b to -ub for embeddings, but with a KV stream per slot (its default with -np) llama.cpp
splits a batch into equal-length ubatches, cutting sequences: measured, the server's batched
vectors then differ from its own one-at-a-time vectors (cosine 0.95-0.98 for 3 of 6 inputs);
--kv-unified keeps each sequence whole. Llama with n_ubatch < n_batch cuts them the same way.
The engine's embedding context keeps them whole (a unified cache; it pools itself, over the
whole batch's states, for a generative LM).

Model load and server start are not timed; each system embeds one warm-up input first.
Figures are inputs/s and tokens/s of wall clock, ratios per pair (run i over run i); the
engine's vectors are compared with llama-server's (cosine, per input: min and mean).
llama-server is built once (cached) by ../shared/tools/build-llama-cpp-tools.sh; --bin DIR
uses an existing build, --no-server skips it. It measures and prints; it never asserts.

  python benchmarks/embeddings_vs.py [--inputs 2000] [--threads 2] [--repeat 2] [--batch 512]
      [--server-slots 32] [--clients 8] [--chunk 32] [--bin DIR] [--model PATH] [--no-server]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _bench import machine_line, model_path, say

from vs_llama_server import Server, same_kernels  # noqa: F401  (same_kernels: the server's flags for the engine's kernels)

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / ".." / "shared" / "tools" / "build-llama-cpp-tools.sh"
WORDS = ("the of and a to in is was he for it with as his on be at by had are but from or have an they which one "
         "you were all we her she there would their will when who him been has more if no out do so can what up "
         "said about other into than its time only could new them man some these then two first may any like "
         "now my such make over our even most me state after also made many did must before back see through "
         "way where get much go well your know should down work year because come people just say each those "
         "take day good how long little use own three right here part government under great might place "
         "river mountain engine library harbour violin orchard lantern glacier meadow").split()


def make_inputs(tokenize, n: int, lo: int, hi: int, seed: int = 7) -> tuple[list[str], list[list[int]]]:
    """n texts whose tokenization (with BOS) is lo..hi tokens, and those token ids."""
    rng = random.Random(seed)
    texts, ids = [], []
    while len(texts) < n:
        want = rng.randint(lo, hi)
        words = [rng.choice(WORDS) for _ in range(max(1, int(want * 0.8)))]
        text = " ".join(words).capitalize() + "."
        toks = tokenize(text)
        while len(toks) > want and len(words) > 1:
            words.pop()
            text = " ".join(words).capitalize() + "."
            toks = tokenize(text)
        if lo <= len(toks) <= hi:
            texts.append(text)
            ids.append(toks)
    return texts, ids


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


class EmbedServer(Server):
    def embed(self, chunk: list[list[int]]) -> list[list[float]]:
        body = json.dumps({"input": chunk, "model": "m", "encoding_format": "float"}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/embeddings", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            data = json.load(r)["data"]
        return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]


def run_engine(engine, ids: list[list[int]]) -> tuple[float, list[list[float]]]:
    t0 = time.perf_counter()
    vectors = [e.vector for e in engine.embed(ids)]
    return time.perf_counter() - t0, vectors


def run_server(server: EmbedServer, ids: list[list[int]], clients: int, chunk: int) -> tuple[float, list[list[float]]]:
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as pool:
        parts = list(pool.map(server.embed, chunks))
    return time.perf_counter() - t0, [v for part in parts for v in part]


def run_llama_embed(llm, texts: list[str]) -> tuple[float, list[list[float]]]:
    t0 = time.perf_counter()
    vectors = llm.embed(texts)
    return time.perf_counter() - t0, vectors


def main() -> int:
    ap = argparse.ArgumentParser(prog="embeddings_vs.py", description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=2000, help="inputs to embed (default 2000)")
    ap.add_argument("--min-tokens", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="rounds of A B C (default 2)")
    ap.add_argument("--batch", type=int, default=512, help="tokens per llama_decode, every system (default 512)")
    ap.add_argument("--server-slots", type=int, default=32)
    ap.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients (default 8)")
    ap.add_argument("--chunk", type=int, default=32, help="inputs per /v1/embeddings request (default 32)")
    ap.add_argument("--bin", help="folder with llama-server (default: build it once with the shared script)")
    ap.add_argument("--model", help="GGUF (default: the bundled Gemma 3 270M)")
    ap.add_argument("--no-server", action="store_true", help="skip llama-server (engine against Llama.embed only)")
    args = ap.parse_args()
    if args.max_tokens > args.batch:
        ap.error("--max-tokens must fit one llama_decode (--batch)")

    import llama_cpp
    from llamabatch import Engine, EngineConfig
    from llamabatch.llama.cpu_kernels import high_level_llama

    model = model_path(args.model)
    say(f"machine: {machine_line(model)}")
    engine = Engine(EngineConfig(model=model, n_parallel=1, n_ctx=max(args.batch, 256), n_batch=args.batch,
                                 threads=args.threads, pooling="mean"))
    texts, ids = make_inputs(engine.tokenize, args.inputs, args.min_tokens, args.max_tokens)
    tokens = sum(map(len, ids))
    say(f"{len(ids)} inputs, {tokens} tokens ({min(map(len, ids))}..{max(map(len, ids))} each)")
    llm = high_level_llama(model, None, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                           n_ctx=args.batch, n_batch=args.batch, n_ubatch=args.batch, n_threads=args.threads,
                           n_threads_batch=args.threads, verbose=False)  # on the engine's weight layout
    server = None
    if not args.no_server:
        binary = Path(args.bin or subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True,
                                                 text=True).stdout.strip().splitlines()[-1]) / "llama-server"
        server = EmbedServer(str(binary), model, args.threads,
                             ["--embeddings", "--pooling", "mean", "--kv-unified", "-np", str(args.server_slots),
                              "-c", str(args.server_slots * 256), "-b", str(args.batch), "-ub", str(args.batch)])
        server.__enter__()
    systems = {"engine": lambda: run_engine(engine, ids), "llama.embed": lambda: run_llama_embed(llm, texts)}
    if server is not None:
        systems["server"] = lambda: run_server(server, ids, args.clients, args.chunk)
    try:
        engine.embed(ids[0])  # warm-ups: contexts made, caches touched
        llm.embed(texts[0])
        if server is not None:
            server.embed([ids[0]])
        times: dict[str, list[float]] = {name: [] for name in systems}
        vectors: dict[str, list] = {}
        for r in range(1, args.repeat + 1):
            for name, run in systems.items():
                seconds, vecs = run()
                times[name].append(seconds)
                vectors[name] = vecs
                say(f"round {r} {name:12s} {seconds:8.2f} s  {len(ids) / seconds:8.1f} inputs/s  "
                    f"{tokens / seconds:8.1f} tok/s")
        # the same computation? the first inputs one at a time on both (no batch-mates)
        alone = {"engine": [engine.embed(t)[0].vector for t in ids[:8]]}
        if server is not None:
            alone["server"] = [server.embed([t])[0] for t in ids[:8]]
    finally:
        engine.close()
        if server is not None:
            server.__exit__(None, None, None)
    print(f"machine: {machine_line(model)} (load at the end); {args.threads} threads; {len(ids)} inputs of "
          f"{args.min_tokens}-{args.max_tokens} tokens ({tokens} tokens); batch {args.batch}")
    print(f"{'system':12s} {'inputs/s':>24s} {'tok/s':>24s}")
    for name, ts in times.items():
        print(f"{name:12s} {' '.join(f'{len(ids) / t:7.1f}' for t in ts):>24s} "
              f"{' '.join(f'{tokens / t:7.1f}' for t in ts):>24s}")
    for other in [n for n in systems if n != "engine"]:
        ratios = [o / e for e, o in zip(times["engine"], times[other])]
        print(f"engine / {other}: {' '.join(f'{x:.2f}x' for x in ratios)} per pair (median {statistics.median(ratios):.2f}x)")
    for other in [n for n in ("server", "llama.embed") if n in vectors]:
        cos = [cosine(a, b) for a, b in zip(vectors["engine"], vectors[other])]
        print(f"cosine engine vs {other}, batched as each batches: min {min(cos):.6f}, mean {statistics.fmean(cos):.7f}, "
              f"{sum(c >= 0.9999 for c in cos)} of {len(cos)} >= 0.9999")
    if "server" in alone:
        cos = [cosine(a, b) for a, b in zip(alone["engine"], alone["server"])]
        print(f"cosine engine vs server, first {len(cos)} inputs one at a time: min {min(cos):.7f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
