"""The disk prefix store, measured in one process run, A B A B, ratios per pair:

  (1) `llamabatch chat -c` on a saved ~3,000-token conversation: time to the first reply token
      with the store (the last turn's KV is restored from disk) and without it
      (`--prefix-store off`: the history is evaluated again, as before the store). Measured on
      the chat process a user runs, two ways: from the process start (Python start-up and the
      model load included) and from its "continuing conversation" line (the model is loaded,
      the history is being restored or evaluated) to the first byte of the reply on stdout.
      Each run asks one question and /undo-es it, so every run continues the same conversation.
  (2) vs_llama_server.py's workload (b), 64 lines sharing a ~700-token instruction, 16 tokens
      out each: a tuned llama-server against the engine run twice on one store folder, the
      first run on an empty store (it saves the shared instruction), the second restoring it
      (as a re-run or a --resume of a labelling job would). Generated tokens per second of wall
      clock, the same token-id prompts for both sides, greedy, ignore_eos.
  (3) The interleaved-instructions reordering is measured by benchmarks/reorder_interleaved.py.

It measures and prints; it never asserts on time. Usage:

  python benchmarks/prefix_store.py [--rounds 3] [--threads 2] [--turns 3000] [--parts 1,2]
      [--slots 8] [--bin DIR] [--model PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _bench import Pairs, llamabatch_command, machine_line, model_path, say, workload_args
import vs_llama_server as vs

from llamabatch import Engine, EngineConfig

CHAT_CTX = 4096  # the conversation (~3,000 tokens) and the question fit in one slot
QUESTION = "In one sentence: what did we talk about first?"
SEED = "Summarise our conversation in one line."


# -- (1) chat -c -----------------------------------------------------------------------------

TOPICS = ["the lighthouse on the northern cape", "the history of sourdough bread", "how glaciers move",
          "the printing press", "honeybee colonies in winter", "the Silk Road caravans", "tides and the moon",
          "old mechanical clocks", "coral reefs", "the first transatlantic telegraph cable", "desert plants",
          "the northern lights", "night trains across Europe", "volcanic islands"]


def exchange(i: int) -> list[dict]:
    """One user question and a long, plain assistant answer (a saved conversation's turn)."""
    topic = TOPICS[i % len(TOPICS)]
    answer = " ".join(
        f"Point {k + 1} about {topic}: people who study it closely note that detail number {i * 7 + k} "
        f"matters more than most visitors expect, because it changes with the season, the weather and "
        f"the tools that were available at the time."
        for k in range(6))
    return [{"role": "user", "content": f"Tell me about {topic}, please, with several concrete details."},
            {"role": "assistant", "content": answer}]


def build_conversation(engine: Engine, tokens: int) -> list[dict]:
    """Exchanges until the rendered conversation is about `tokens` tokens long."""
    messages: list[dict] = []
    i = 0
    while True:
        grown = messages + exchange(i)
        n = len(engine.tokenize(engine.chat_template.render(grown, add_generation_prompt=True), special=True))
        if n > tokens and messages:
            return messages
        messages, i = grown, i + 1


@dataclass
class ChatRun:
    from_start_s: float  # process start -> first reply byte on stdout
    from_loaded_s: float  # "continuing conversation" line -> first reply byte
    reply: str
    stats: dict


def chat_c(model: str, threads: int, state: Path, store: str, question: str, max_tokens: int,
           undo: bool = True) -> ChatRun:
    """`llamabatch chat -c --verbose` with one piped question (then, with `undo`, /undo: the
    conversation stays as it was for the next run), timed from outside the process."""
    from llamabatch.chat.ollama_stats import parse_stats

    cmd = llamabatch_command("chat", "-c", "--verbose", "-m", model, "--n-ctx", str(CHAT_CTX), "--threads",
                             str(threads), "--temperature", "0", "--max-tokens", str(max_tokens),
                             "--prefix-store", store)
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    marks: dict[str, float] = {}
    err: list[str] = []
    out: list[bytes] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def read_err() -> None:
        for raw in proc.stderr:  # type: ignore[union-attr]
            line = raw.decode("utf-8", "replace")
            if "continuing conversation" in line:
                marks.setdefault("loaded", time.perf_counter())
            err.append(line)

    def read_out() -> None:
        first = proc.stdout.read(1)  # type: ignore[union-attr]
        marks["first"] = time.perf_counter()
        out.append(first + proc.stdout.read())  # type: ignore[union-attr]

    readers = [threading.Thread(target=read_err), threading.Thread(target=read_out)]
    for r in readers:
        r.start()
    proc.stdin.write(f"{question}\n{'/undo' if undo else ''}\n".encode())  # type: ignore[union-attr]
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(1800)
    for r in readers:
        r.join()
    text = "".join(err)
    if proc.returncode != 0 or "first" not in marks or "loaded" not in marks:
        raise SystemExit(f"chat -c failed (exit {proc.returncode}):\n{text}")
    blocks = parse_stats(text)
    return ChatRun(marks["first"] - t0, marks["first"] - marks["loaded"], b"".join(out).decode().strip(),
                   blocks[0] if blocks else {})


def tokens_in(stats: dict, label: str) -> int:
    return int(stats.get(label, "0").split()[0])


def part_chat(model: str, threads: int, rounds: int, size: int) -> None:
    from llamabatch.chat.store import Store

    with Engine(EngineConfig(model=model, n_parallel=1, n_ctx=CHAT_CTX, threads=threads)) as probe:
        messages = build_conversation(probe, size)
        n_tokens = len(probe.tokenize(probe.chat_template.render(messages, add_generation_prompt=True), special=True))
        model_name, template = probe.model_name, probe.chat_template.name
    work = Path(tempfile.mkdtemp(prefix="prefix-store-bench-"))
    state, store = work / "state", work / "store"
    db = Store(state / "llamabatch" / "conversations.db")
    cid = db.new_conversation(model=model_name, template=template, settings={}, system=None)
    db.change(cid, add=messages)
    db.close()
    say(f"== (1) chat -c: conversation {cid}, {len(messages)} messages, {n_tokens} tokens; a first turn saves its KV")
    seed = chat_c(model, threads, state, str(store), SEED, 4, undo=False)  # evaluates the history once, saves it
    seed_stats = seed.stats
    db = Store(state / "llamabatch" / "conversations.db")
    entry = db.read(cid).kv_entries[-1]  # type: ignore[union-attr]
    db.close()
    if entry is None:
        raise SystemExit("the seeding turn saved no prefix store entry: nothing to restore")
    say(f"   seeded: {tokens_in(seed_stats, 'prompt eval count') + tokens_in(seed_stats, 'cached tokens')} "
        f"prompt tokens, entry {entry} ({(store / entry).stat().st_size / 1e6:.1f} MB)")

    with_store = lambda: chat_c(model, threads, state, str(store), QUESTION, 8)
    without = lambda: chat_c(model, threads, state, "off", QUESTION, 8)
    runs: list[tuple[ChatRun, ChatRun]] = []
    from_start, from_loaded = Pairs(), Pairs()
    for r in range(1, rounds + 1):
        a, b = without(), with_store()
        if not b.reply or tokens_in(b.stats, "restored tokens") == 0:
            raise SystemExit(f"round {r}: the run with the store restored nothing (reply {b.reply!r}); "
                             f"its stats: {b.stats}")
        runs.append((a, b))
        from_start.add(b.from_start_s, a.from_start_s)
        from_loaded.add(b.from_loaded_s, a.from_loaded_s)
        say(f"   round {r}: without {a.from_loaded_s:.2f} s ({a.from_start_s:.2f} s from start), with the store "
            f"{b.from_loaded_s:.2f} s ({b.from_start_s:.2f} s), {tokens_in(b.stats, 'restored tokens')} tokens "
            f"restored; load average {os.getloadavg()[0]:.2f}")
        if a.reply != b.reply:
            prompt = lambda run: tokens_in(run.stats, "prompt eval count") + tokens_in(run.stats, "cached tokens")
            say(f"   replies differ: without {a.reply!r} ({prompt(a)} prompt tokens), with {b.reply!r} "
                f"({prompt(b)}): a near tie decided otherwise (restored KV sits in other cells), or the "
                f"history tokenized otherwise without the saved turn's tokens")
    print(f"## (1) `chat -c` on a saved {n_tokens}-token conversation ({len(messages)} messages): time to the "
          f"first reply token\n")
    print("| round | without the store: from loaded / from start (s) | with the store (s) | restored tokens | "
          "without / with, from loaded | without / with, from start | same reply |")
    print("|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(runs):
        print(f"| {i + 1} | {a.from_loaded_s:.2f} / {a.from_start_s:.2f} | {b.from_loaded_s:.2f} / {b.from_start_s:.2f} | "
              f"{tokens_in(b.stats, 'restored tokens')} | {from_loaded.ratios[i]:.1f}x | {from_start.ratios[i]:.2f}x | "
              f"{'yes' if a.reply == b.reply else 'no'} |")
    print(f"\nmedian without / with: {from_loaded.median():.1f}x from the model loaded, "
          f"{from_start.median():.2f}x from the process start\n", flush=True)


# -- (2) the shared-instruction file, twice, vs llama-server -------------------------------------

def part_shared(model: str, threads: int, rounds: int, slots: int, bin_dir: str | None) -> None:
    bin_dir = bin_dir or subprocess.run(["bash", str(vs.BUILD_SCRIPT)], capture_output=True, text=True,
                                        check=True).stdout.strip().splitlines()[-1]
    server_bin = str(Path(bin_dir) / "llama-server")
    with Engine(EngineConfig(model=model, n_parallel=1, n_ctx=2048, threads=threads)) as probe:
        (w,) = vs.workloads(probe.tokenize, "b")
    say(f"== (2) {w.title} ({w.notes})")
    server_args = ["-np", str(slots), "-c", str(vs.SLOT_CTX * slots), "--swa-full"]
    rows: dict[str, list[float]] = {"server-tuned": [], "engine, empty store (1st run)": [],
                                    "engine, filled store (2nd run)": []}
    notes: dict[str, str] = {}
    for r in range(1, rounds + 1):
        store = tempfile.mkdtemp(prefix="prefix-store-b-")
        tok_s, notes["server-tuned"] = vs.run_server(server_bin, model, threads, server_args, w)
        rows["server-tuned"].append(tok_s)
        for name in ("engine, empty store (1st run)", "engine, filled store (2nd run)"):
            tok_s, notes[name] = vs.run_engine(model, threads, slots, w, prefix_store=store)
            rows[name].append(tok_s)
        say(f"   round {r}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in rows.items())
            + f"; load average {os.getloadavg()[0]:.2f}")
    print(f"## (2) {w.title} ({w.notes}), {slots} slots: generated tok/s\n")
    print("| system | tok/s per round | notes (last round) |\n|---|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {vs.fmt(values)} | {notes[name]} |")
    server = rows["server-tuned"]
    print()
    for name in list(rows)[1:]:
        ratios = [e / s for e, s in zip(rows[name], server) if s]
        print(f"- {name} / server-tuned, per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})")
    print(flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, slots=8, threads=2, rounds=3, model=True)
    ap.add_argument("--parts", default="1,2", help="1: chat -c; 2: the shared-instruction file vs llama-server")
    ap.add_argument("--turns", type=int, default=3000, help="tokens of the saved conversation (default 3000)")
    ap.add_argument("--bin", help="folder with llama-server [default: build it, cached]")
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"1", "2"}:
        ap.error("--parts takes 1 and/or 2")
    model = model_path(args.model)
    print(f"# The disk prefix store: {Path(model).name}, {args.threads} threads, greedy; "
          f"{machine_line(model)} at the start\n", flush=True)
    if "1" in parts:
        part_chat(model, args.threads, args.rounds, args.turns)
    if "2" in parts:
        part_shared(model, args.threads, args.rounds, args.slots, args.bin)
    print(f"(load average {os.getloadavg()[0]:.2f} at the end; the interleaved-instructions reordering: "
          f"benchmarks/reorder_interleaved.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
