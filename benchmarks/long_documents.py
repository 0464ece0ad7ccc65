"""Long documents with default settings (`--n-ctx auto`), through `llamabatch run` as a user runs it.

    python benchmarks/long_documents.py [-m MODEL] [--threads 2] [--rounds 2] [--skip-docs] [--skip-mixed]
                                        [--docs 8] [--doc-words 4600] [--short 200] [--long 2] [--long-words 18000]

1. Documents: --docs lines, each a document of ~5,000 tokens (Gemma) and a one-word question.
   Default settings against today's default (`--n-ctx` = 4,096 x the slots, given explicitly):
   lines answered out of --docs, and wall time.
2. Mostly short: --short lines of ~100 tokens plus --long lines of ~20,000 tokens (placed a
   quarter and three quarters into the file), default settings, against the same file without
   the long lines, alternating A B A B: every line answered; the short lines' throughput
   (their generated tokens over the time from the first record to the last short record, with
   `--order completion`) as a ratio B/A per pair (target >= 0.9); the peak RSS of the engine
   process against the memory the header states.
Measures and prints (figures on stdout, progress on stderr); asserts nothing on time.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import Pairs, llamabatch_command, machine_line, model_path, say

WORDS = ("river stone garden market window silver orange engine harbor winter lantern meadow copper signal violet "
         "anchor feather canyon marble thunder velvet orchard compass glacier ribbon falcon pepper summit cobalt "
         "willow quartz saddle beacon").split()
QUESTION = "\nQuestion: which word opens this text? Answer:"


def document(rng: random.Random, words: int) -> str:
    sentences = [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(words // 12)]
    return " ".join(sentences)


def write_lines(path: Path, bodies: list[tuple[str, str]], max_tokens: int) -> Path:
    with open(path, "w") as f:
        for key, body in bodies:
            f.write(json.dumps({"id": key, "prompt": body + QUESTION, "max_tokens": max_tokens, "temperature": 0})
                    + "\n")
    return path


# Runs a command and then prints the peak RSS of its largest process (the engine's child
# included: reaped descendants count in RUSAGE_CHILDREN) as its last stderr line.
PEAK_WRAPPER = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
                "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
                "sys.exit(rc)")


def run(path: Path, model: str, threads: int, *extra: str) -> dict:
    """One `llamabatch run` with records on stdout in completion order: each record's arrival
    time, the header line, the records and the run's peak RSS (its largest process)."""
    cmd = llamabatch_command("run", str(path), "-m", model, "--threads", str(threads), "--order", "completion",
                             "-o", "-", *extra)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", PEAK_WRAPPER, *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    records, arrivals = [], []
    for line in proc.stdout:  # type: ignore[union-attr]
        arrivals.append(time.perf_counter() - start)
        records.append(json.loads(line))
    err = proc.stderr.read()  # type: ignore[union-attr]
    proc.wait()
    peak = next((int(l.split()[1]) for l in err.splitlines() if l.startswith("PEAK_RSS_KIB")), None)
    header = next((l for l in err.splitlines() if " slots x " in l), "")
    return {"records": records, "arrivals": arrivals, "wall_s": time.perf_counter() - start, "rc": proc.returncode,
            "header": header, "peak_mib": peak / 1024 if peak else None, "stderr": err}


def answered(result: dict) -> int:
    return sum(1 for r in result["records"] if r.get("error") is None)


def short_throughput(result: dict) -> tuple[float, int]:
    """Generated tokens of the short lines per second, from the first record to the last short one."""
    shorts = [(t, r) for t, r in zip(result["arrivals"], result["records"]) if str(r.get("id", "")).startswith("s")]
    if not shorts:
        return 0.0, 0
    span = shorts[-1][0] - result["arrivals"][0]
    tokens = sum(r["usage"]["completion_tokens"] for _, r in shorts if r.get("usage"))
    return (tokens / span if span > 0 else 0.0), len(shorts)


def documents(args: argparse.Namespace, tmp: Path) -> None:
    rng = random.Random(0)
    path = write_lines(tmp / "docs.jsonl", [(f"d{i}", document(rng, args.doc_words)) for i in range(args.docs)], 8)
    print(f"\n## {args.docs} documents of ~5,000 tokens, one-word question (max_tokens 8)\n")
    print("| settings | answered | wall s | header |")
    print("|---|---|---|---|")
    for label, extra in (("today's default (--n-ctx 32768, 8 slots x 4,096)", ("--n-ctx", "32768", "--n-parallel", "8")),
                         ("default (--n-ctx auto)", ())):
        say(f"documents: {label}")
        r = run(path, args.model, args.threads, *extra)
        print(f"| {label} | {answered(r)} of {args.docs} | {r['wall_s']:.1f} | {r['header'][:160]} |")


def mostly_short(args: argparse.Namespace, tmp: Path) -> None:
    rng = random.Random(1)
    shorts = [(f"s{i}", document(rng, 72)) for i in range(args.short)]
    longs = [(f"L{i}", document(rng, args.long_words)) for i in range(args.long)]
    mixed = list(shorts)
    for i, line in enumerate(longs):
        mixed.insert((i + 1) * len(shorts) // (len(longs) + 1) + i, line)
    with_long = write_lines(tmp / "mixed.jsonl", mixed, args.max_tokens)
    without = write_lines(tmp / "short.jsonl", shorts, args.max_tokens)
    print(f"\n## {args.short} short lines (~100 tokens) + {args.long} of ~20,000 tokens, max_tokens "
          f"{args.max_tokens}, default settings\n")
    print("| pair | without long: short tok/s | with long: short tok/s | ratio | answered (with long) | "
          "wall s (without, with) | peak RSS MiB (without, with) |")
    print("|---|---|---|---|---|---|---|")
    pairs, headers = Pairs(), set()
    for i in range(1, args.rounds + 1):
        say(f"mostly short: round {i}, without the long lines")
        a = run(without, args.model, args.threads)
        say(f"mostly short: round {i}, with them")
        b = run(with_long, args.model, args.threads)
        (ta, _), (tb, _) = short_throughput(a), short_throughput(b)
        ratio = pairs.add(ta, tb)
        headers.add(b["header"])
        rss = lambda r: f"{r['peak_mib']:.0f}" if r["peak_mib"] else "?"  # noqa: E731
        print(f"| {i} | {ta:.1f} | {tb:.1f} | {ratio:.2f} | {answered(b)} of {len(mixed)} | "
              f"{a['wall_s']:.0f}, {b['wall_s']:.0f} | {rss(a)}, {rss(b)} |")
    print(f"\nmedian ratio {pairs.median():.2f} (target >= 0.9)")
    for h in headers:
        print(f"header (with long): {h}")
    if pairs.ratios:
        print(f"long lines' prompt tokens: {statistics.mean(r['usage']['prompt_tokens'] for r in b['records'] if str(r['id']).startswith('L') and r.get('usage')):.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--doc-words", type=int, default=4600)
    ap.add_argument("--short", type=int, default=200)
    ap.add_argument("--long", type=int, default=2)
    ap.add_argument("--long-words", type=int, default=18000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--skip-docs", action="store_true")
    ap.add_argument("--skip-mixed", action="store_true")
    args = ap.parse_args()
    args.model = model_path(args.model)
    print(f"machine: {machine_line(args.model)}")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_docs:
            documents(args, Path(tmp))
        if not args.skip_mixed:
            mostly_short(args, Path(tmp))


if __name__ == "__main__":
    main()
