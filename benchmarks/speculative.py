"""Speculative decoding from the text itself side by side, in one process run.

Workloads (SmolLM2-135M-Instruct by default; chat lines rendered with the engine's template,
the same token ids for every side; greedy):
  e  edit: --edit-lines "fix the spelling" lines, each a 150-250-token paragraph with a few
     misspelled words; the engine's requests carry prediction = the paragraph
  f  extraction: lines asking to copy, word for word, the sentences of a document that
     mention a topic (prompt lookup: no prediction)
  a  free generation: short essays, 64 tokens each (ignore_eos: every side the same count)
  c  mixed prompt lengths: vs_llama_server.py's (c), 24 prompts of 10-1,500 tokens, 32 out
  q  a chat turn at one slot that quotes the previous answer: turn 1 is generated untimed, turn
     2 asks to repeat it with a title (prompt lookup finds the answer in the history); as in
     `llamabatch chat`, the conversation so far is in the KV cache when turn 2 starts (the
     warm-up request is turn 1's prompt and answer, on every side), so the turn prefills only
     its new message

Systems, each run on a fresh engine or server (load not timed, one untimed warm-up request):
  auto    the Engine, --speculative auto (the default)
  off     the Engine, --speculative off
  ceiling the Engine, --speculative auto, each line's prediction = off's answer of the same
          round: every guess right (up to near-ties), so ceiling / off is the most any
          drafter could gain here, at this slot count, on this machine (--no-ceiling skips it)
  server  llama.cpp's llama-server (-np SLOTS --swa-full), once per --server-specs setting
          (none and --spec-type ngram-*), built once and cached by
          ../shared/tools/build-llama-cpp-tools.sh (with nice -n 19); its best setting per
          workload (the highest median tok/s) is the one the ratios use
Every round runs every system in this order, auto and off swapped every other round; ratios are per round (others share
the CPU), and the medians over rounds the summary. Figures: generated tokens per wall second;
for the engine also the guesses verified and kept (acceptance rate) and mean rows a tick.

Usage:
  python benchmarks/speculative.py [-m smollm2] [--workloads e,f,a,c,q] [--slots 4] [--threads 2]
      [--rounds 2] [--edit-lines 16] [--bin DIR] [--server-specs "none,ngram-simple,ngram-map-k,ngram-mod"]
      [--no-server] [--no-ceiling] [--server-workloads e,f,q] [--c-prompts 24]
It measures and prints; it never asserts on time.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from _bench import machine_line, model_path, say, server_completion, timed_generate, workload_args

from llamabatch import Engine, EngineConfig, SamplingParams

SLOT_CTX = 2048
SENTENCES = [
    "The harbour was quiet in the early morning, and only a few fishing boats were moving.",
    "Maria opened the bakery at six and set out the first loaves of bread on the counter.",
    "A small dog followed the postman along the street, barking at every gate it passed.",
    "The council decided to repair the old bridge before the winter storms arrived.",
    "Students gathered in the library to prepare for their final examinations.",
    "The museum announced a new exhibition about the history of the railway.",
    "Heavy rain flooded the lower fields, so the farmers moved their sheep to the hills.",
    "The orchestra rehearsed for three hours, and the conductor was finally satisfied.",
    "Tourists walked along the river to watch the sunset behind the cathedral.",
    "A new bus line will connect the village with the hospital in the next town.",
    "The children planted tomatoes and beans in the school garden last spring.",
    "Engineers tested the water pipes and found a leak under the main square.",
    "The market sold fresh apples, honey, cheese and handmade baskets every Saturday.",
    "Our neighbour repaired his bicycle and rode to work for the first time in years.",
    "The weather service warned that strong winds could damage roofs along the coast.",
    "A local author read from her new novel to a crowd of enthusiastic readers.",
    "The football team trained in the snow because the match could not be postponed.",
    "Volunteers cleaned the beach and collected more than forty bags of plastic.",
    "The restaurant changed its menu to include more vegetables from nearby farms.",
    "Scientists measured the temperature of the lake every week for ten years.",
]
# SmolLM2-135M copies the paragraph (with or without a preamble) under this system prompt; asked
# in the user turn to "fix the spelling" it mostly comments on the request instead
PROOFREADER = ("You are a proofreader. You repeat the user's text exactly, with only the spelling mistakes "
               "corrected.")
TOPICS = ["the bridge", "the library", "the river", "the weather", "the market", "the school"]


def misspell(paragraph: str, rng: random.Random, n: int = 6) -> str:
    """n words of five letters or more with two inner letters swapped."""
    words = paragraph.split(" ")
    long_words = [i for i, w in enumerate(words) if len(w.strip(".,")) >= 5]
    for i in rng.sample(long_words, min(n, len(long_words))):
        w = words[i]
        j = rng.randrange(1, len(w.strip(".,")) - 2)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


@dataclass
class Workload:
    key: str
    title: str
    messages: list  # per line: chat messages
    params: list[SamplingParams]  # per line, for the engine
    slots: int
    prompts: list[list[int]] = field(default_factory=list)  # the rendered token ids (both sides)
    warm: list[int] | None = None  # the untimed warm-up prompt (None: two tokens of the first line)


def edit_lines(n: int, tokens) -> Workload:
    rng = random.Random(38)
    messages, params = [], []
    for _ in range(n):
        while True:
            paragraph = misspell(" ".join(rng.sample(SENTENCES, rng.randint(7, 10))), rng)
            if 150 <= len(tokens(paragraph)) <= 250:
                break
        messages.append([{"role": "system", "content": PROOFREADER}, {"role": "user", "content": paragraph}])
        params.append(SamplingParams(temperature=0, max_tokens=320, prediction=paragraph))
    return Workload("e", f"edit: {n} 'fix the spelling' lines, 150-250-token paragraphs, prediction = the paragraph",
                    messages, params, 0)


def extraction_lines(n: int) -> Workload:
    rng = random.Random(39)
    messages = []
    for i in range(n):
        document = " ".join(rng.sample(SENTENCES, 12))
        topic = TOPICS[i % len(TOPICS)]
        messages.append([{"role": "user", "content": f"Copy, word for word, every sentence of this text that mentions "
                                                      f"{topic}, one per line.\n\n{document}"}])
    params = [SamplingParams(temperature=0, max_tokens=160)] * n
    return Workload("f", f"extraction: {n} lines quoting sentences of a 12-sentence document (prompt lookup)",
                    messages, params, 0)


def free_lines(n: int) -> Workload:
    topics = ["a lighthouse keeper", "honeybees", "a train journey", "volcanoes", "a chess match", "tides",
              "an old library", "a jazz musician"]
    messages = [[{"role": "user", "content": f"Write a short essay about {topics[i % len(topics)]}."}] for i in range(n)]
    params = [SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)] * n
    return Workload("a", f"free generation: {n} essays x 64 tokens", messages, params, 0)


def build(args, model: str) -> list[Workload]:
    """The workloads of --workloads with their prompts as the engine's token ids."""
    with Engine(EngineConfig(model=model, n_parallel=1, n_ctx=SLOT_CTX, threads=args.threads)) as engine:
        def tokens(text: str) -> list[int]:
            return engine.tokenize(text)

        out = []
        for key in args.workloads.split(","):
            if key == "e":
                w = edit_lines(args.edit_lines, tokens)
            elif key == "f":
                w = extraction_lines(args.edit_lines)
            elif key == "a":
                w = free_lines(16)
            elif key == "c":
                out.append(mixed_lengths(engine, args.c_prompts))
                continue
            elif key == "q":
                out.append(quoting_turn(engine))
                continue
            else:
                raise SystemExit(f"--workloads: unknown workload {key!r} (e, f, a, c, q)")
            w.slots = args.slots
            w.prompts = [engine.tokenize(engine.render_chat(m), special=True) for m in w.messages]
            out.append(w)
    for w in out:
        w.slots = w.slots or args.slots
    return out


def mixed_lengths(engine: Engine, n: int) -> Workload:
    from vs_llama_server import workloads as server_workloads

    (c,) = server_workloads(lambda text: engine.tokenize(text, special=True), "c")
    c.prompts = c.prompts[:n]
    params = [SamplingParams(temperature=0, max_tokens=c.max_tokens, ignore_eos=True)] * len(c.prompts)
    lengths = sorted(map(len, c.prompts))
    w = Workload("c", f"mixed prompt lengths: {len(c.prompts)} prompts of {lengths[0]}-{lengths[-1]} tokens, "
                      f"{c.max_tokens} out", [None] * len(c.prompts), params, 0)
    w.prompts = c.prompts
    return w


def quoting_turn(engine: Engine) -> Workload:
    """Turn 1 generated here (untimed), turn 2 quotes it: one line, one slot."""
    first = [{"role": "user", "content": "Describe a small harbour town in the morning, in about eight sentences."}]
    answer = engine.generate([first], SamplingParams(temperature=0, max_tokens=200))[0].text
    second = first + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": "Repeat your description word for word, with a title line first."}]
    w = Workload("q", f"chat turn quoting the previous answer ({len(engine.tokenize(answer))} tokens), one slot",
                 [second], [SamplingParams(temperature=0, max_tokens=260)], 1)
    w.prompts = [engine.tokenize(engine.render_chat(second), special=True)]
    # the conversation so far, as `llamabatch chat` holds it in the KV cache: the tokens turn 2
    # shares with turn 1's prompt and answer
    before = engine.tokenize(engine.render_chat(first[:1] + [{"role": "assistant", "content": answer}]), special=True)
    shared = next((i for i, (a, b) in enumerate(zip(before, w.prompts[0])) if a != b), min(len(before), len(w.prompts[0])))
    w.warm = w.prompts[0][:shared]
    w.title += f" ({shared} of the turn's {len(w.prompts[0])} prompt tokens cached from turn 1)"
    return w


# -- one run of one system ---------------------------------------------------------------------

@dataclass
class Run:
    tokens: int
    seconds: float
    drafted: int = 0
    accepted: int = 0
    ticks: int = 0
    rows: float = 0.0  # mean rows a decode tick
    texts: list[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def engine_run(model: str, args, w: Workload, speculative: str, predictions: list[str] | None = None) -> Run:
    params = w.params if predictions is None else [p.replace(prediction=t) for p, t in zip(w.params, predictions)]
    config = EngineConfig(model=model, n_parallel=w.slots, n_ctx=SLOT_CTX * w.slots, threads=args.threads,
                          speculative=speculative)
    with Engine(config) as engine:
        engine.generate([warm_up(w)], SamplingParams(temperature=0, max_tokens=2))
        run = timed_generate(engine, w.prompts, params)
    if run.failed:
        raise SystemExit(f"engine ({w.key}, {speculative}): {len(run.failed)} lines failed: {run.failed[0].error}")
    decode = [t for t in run.ticks if t.decode_tokens and not t.prefill_tokens]
    return Run(run.generated, run.seconds, sum(t.drafted_tokens for t in run.ticks),
               sum(t.accepted_tokens for t in run.ticks), len(run.ticks),
               sum(t.batch_size for t in decode) / len(decode) if decode else 0.0, [r.text for r in run.results])


def warm_up(w: Workload) -> list[int]:
    """The untimed first request: w.warm, or two tokens of the first line (loads, no prefix)."""
    return w.warm if w.warm is not None else w.prompts[0][:1] + [w.prompts[0][-1]]


def server_run(binary: Path, model: str, args, w: Workload, spec: str) -> Run:
    from vs_llama_server import Server

    extra = ["-np", str(w.slots), "-c", str(SLOT_CTX * w.slots), "--swa-full"]
    if spec != "none":
        extra += ["--spec-type", spec]
    ignore_eos = w.params[0].ignore_eos
    with Server(str(binary / "llama-server"), model, args.threads, extra) as server:
        complete(server.port, warm_up(w), 2, False)  # untimed warm-up
        import time

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(len(w.prompts)) as pool:
            out = list(pool.map(lambda pp: complete(server.port, pp[0], pp[1].max_tokens, ignore_eos),
                                zip(w.prompts, w.params)))
        seconds = time.perf_counter() - t0
    return Run(sum(n for n, _ in out), seconds, texts=[t for _, t in out])


def complete(port: int, prompt: list[int], n: int, ignore_eos: bool) -> tuple[int, str]:
    data = server_completion(port, prompt, n, ignore_eos=ignore_eos)
    return data["tokens_predicted"], data["content"]


def server_bin(args) -> Path:
    import subprocess

    if args.bin:
        return Path(args.bin)
    script = Path(__file__).resolve().parents[1] / ".." / "shared" / "tools" / "build-llama-cpp-tools.sh"
    say("== building (or finding, cached) llama-server: nice -n 19 ../shared/tools/build-llama-cpp-tools.sh")
    out = subprocess.run(["nice", "-n", "19", "bash", str(script)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the llama.cpp tools build failed ({out.returncode}): {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


# -- the table ---------------------------------------------------------------------------------

def run_workload(model: str, args, w: Workload, binary: Path | None) -> dict:
    with_server = binary is not None and w.key in args.server_workloads.split(",")
    servers = [f"server {s}" for s in args.server_specs.split(",")] if with_server else []
    systems = ["auto", "off"] + ([] if args.no_ceiling else ["ceiling"]) + servers
    runs: dict[str, list[Run]] = {s: [] for s in systems}
    print(f"### ({w.key}) {w.title}; {w.slots} slot(s), {sum(map(len, w.prompts))} prompt tokens\n")
    print("| round | system | tokens | seconds | tok/s | guessed | kept | kept/guessed | ticks | rows a decode tick |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rnd in range(1, args.rounds + 1):
        # auto and off swap places every other round (A B, B A): whichever runs first in a
        # round was slower by up to 13% with no guess placed at all; off stays before ceiling,
        # which takes off's answers of the round
        order = systems if rnd % 2 else [systems[1], systems[0], *systems[2:]]
        for system in order:
            say(f"== ({w.key}) round {rnd}: {system}")
            if system.startswith("server "):
                r = server_run(binary, model, args, w, system.split(" ", 1)[1])  # type: ignore[arg-type]
            elif system == "ceiling":
                r = engine_run(model, args, w, "auto", predictions=runs["off"][-1].texts)
            else:
                r = engine_run(model, args, w, system)
            runs[system].append(r)
            rate = f"{r.accepted / r.drafted:.2f}" if r.drafted else "-"
            print(f"| {rnd} | {system} | {r.tokens} | {r.seconds:.2f} | {r.tok_s:.1f} | {r.drafted} | {r.accepted} | "
                  f"{rate} | {r.ticks or '-'} | {r.rows:.1f} |", flush=True)
    return summarize(w, runs)


def summarize(w: Workload, runs: dict[str, list[Run]]) -> dict:
    auto, off = runs["auto"], runs["off"]
    same = sum(x == y for x, y in zip(auto[0].texts, off[0].texts))  # lines, first round
    on_off = [a.tok_s / b.tok_s for a, b in zip(auto, off)]
    servers = {s: r for s, r in runs.items() if s.startswith("server ")}
    best = max(servers, key=lambda s: statistics.median(r.tok_s for r in servers[s])) if servers else None
    on_server = [a.tok_s / b.tok_s for a, b in zip(auto, servers[best])] if best else []
    kept = sum(r.accepted for r in auto)
    guessed = sum(r.drafted for r in auto)
    generated = sum(r.tokens for r in auto)
    print(f"\n- auto / off per round: {', '.join(f'{x:.2f}' for x in on_off)}; median {statistics.median(on_off):.2f}"
          f"; greedy answers identical on and off (first round): {same} of {len(auto[0].texts)} lines")
    ceiling = [c.tok_s / b.tok_s for c, b in zip(runs.get("ceiling", []), off)]
    if ceiling:
        print(f"- ceiling / off per round (every guess right): {', '.join(f'{x:.2f}' for x in ceiling)}; "
              f"median {statistics.median(ceiling):.2f}")
    if best:
        print(f"- auto / {best} (the server's best setting here) per round: "
              f"{', '.join(f'{x:.2f}' for x in on_server)}; median {statistics.median(on_server):.2f}")
    print(f"- acceptance: {kept} of {guessed} guesses kept ({kept / guessed:.0%})" if guessed else
          "- acceptance: no guesses were verified", end="")
    print(f", {kept / generated:.0%} of the generated tokens\n" if generated else "\n", flush=True)
    return {"workload": w.key, "auto_off": statistics.median(on_off),
            "ceiling_off": statistics.median(ceiling) if ceiling else None, "best_server": best,
            "auto_server": statistics.median(on_server) if on_server else None,
            "acceptance": kept / guessed if guessed else None, "identical": f"{same}/{len(auto[0].texts)}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    workload_args(ap, slots=4, threads=2, rounds=2)
    ap.add_argument("-m", "--model", default="smollm2", help="model (default smollm2)")
    ap.add_argument("--workloads", default="e,f,a,c,q", help="comma-separated: e, f, a, c, q (default all)")
    ap.add_argument("--edit-lines", type=int, default=16, help="lines of (e) and (f) (default 16)")
    ap.add_argument("--bin", default=None, help="folder with llama-server (default: build or find it, cached)")
    ap.add_argument("--server-specs", default="none,ngram-simple,ngram-map-k,ngram-mod",
                    help="llama-server settings: none and --spec-type values (default: none and three ngram-* types)")
    ap.add_argument("--no-server", action="store_true", help="the engine alone (auto against off)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the run with every guess right")
    ap.add_argument("--server-workloads", default="e,f,a,c,q", help="workloads that also run llama-server (default all)")
    ap.add_argument("--c-prompts", type=int, default=24, help="prompts of (c), the first N of its 24 (default 24)")
    args = ap.parse_args()
    model = model_path(args.model)
    binary = None if args.no_server else server_bin(args)
    print(f"## Speculative decoding: {Path(model).name}, greedy, {args.threads} threads a side, {args.rounds} rounds\n")
    print(f"{machine_line(model)}\n")
    summaries = [run_workload(model, args, w, binary) for w in build(args, model)]
    print("| workload | auto / off | ceiling / off | auto / server's best | server's best | kept / guessed "
          "| lines identical on/off |")
    print("|---|---|---|---|---|---|---|")
    for s in summaries:
        server = f"{s['auto_server']:.2f}" if s["auto_server"] is not None else "-"
        rate = f"{s['acceptance']:.0%}" if s["acceptance"] is not None else "-"
        ceiling = f"{s['ceiling_off']:.2f}" if s["ceiling_off"] is not None else "-"
        print(f"| ({s['workload']}) | {s['auto_off']:.2f} | {ceiling} | {server} | {s['best_server'] or '-'} | {rate} | "
              f"{s['identical']} |")
    print(f"\n{machine_line(model)} (at the end)")


if __name__ == "__main__":
    main()
