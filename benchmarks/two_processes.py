"""Two `llamabatch run`s at once on the same cores, against one at a time: llama.cpp's OpenMP
threads busy-wait for each other, so two processes that each take every core hold each other up
far beyond sharing them. Arms, alternating in each round (no prefix store, the same file):

  alone           one run, default threads (every core this process may use)
  alone passive   one run, OMP_WAIT_POLICY=PASSIVE (OpenMP's threads sleep instead of spinning)
  pair            two runs started together, default threads
  pair passive    the same, OMP_WAIT_POLICY=PASSIVE in both
  pair pinned     the same, each run pinned to its own half of the cores (taskset's affinity;
                  the default thread count follows it)

Printed per round: wall seconds of each arm (a pair: until both end), and each pair's wall over
twice the lone run's (1.0: as fast as running the two one after the other; 0.5: perfect overlap).

Usage: python benchmarks/two_processes.py [--lines 16] [--tokens 96] [--slots 8] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _bench import llamabatch_command, machine_line, model_path, read_records, say, sky_prompts, write_prompt_lines

OPENMP_WAITS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def timed_runs(lines: Path, folder: Path, expected: int, model: str, slots: int, *, copies: int,
               passive: bool = False, pinned: bool = False) -> float:
    """Wall seconds from starting `copies` runs of `lines` together until the last one ends."""
    env = {key: value for key, value in os.environ.items() if key not in OPENMP_WAITS}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cpus = sorted(os.sched_getaffinity(0))
    outs = [folder / f"out{k}.jsonl" for k in range(copies)]
    started = time.perf_counter()
    procs = []
    for k, out in enumerate(outs):
        out.unlink(missing_ok=True)
        share = set(cpus[k::copies]) if pinned else None
        procs.append(subprocess.Popen(
            llamabatch_command("run", str(lines), "-o", str(out), "-m", model, "--n-parallel", str(slots),
                               "--prefix-store", "off", "-q"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=(lambda share=share: os.sched_setaffinity(0, share)) if share else None))
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"llamabatch run exited {proc.returncode}: {err[-400:]}")
    wall = time.perf_counter() - started
    for out in outs:
        read_records(out, expected)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-m", "--model", default=None)
    args = ap.parse_args()
    model = model_path(args.model)
    say(f"# two runs at once: {args.lines} lines x {args.tokens} tokens, {args.slots} slots each; "
        f"{machine_line(model)}")
    arms = {"alone": dict(copies=1), "alone passive": dict(copies=1, passive=True), "pair": dict(copies=2),
            "pair passive": dict(copies=2, passive=True), "pair pinned": dict(copies=2, pinned=True)}
    print("| round | " + " | ".join(f"{arm} (s)" for arm in arms)
          + " | pair / 2 alone | pair passive / 2 alone | pair pinned / 2 alone |")
    print("|---" * (len(arms) + 4) + "|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lines = write_prompt_lines(folder / "lines.jsonl", sky_prompts(args.lines), args.tokens)
        for r in range(1, args.rounds + 1):
            wall = {arm: timed_runs(lines, folder, args.lines, model, args.slots, **how) for arm, how in arms.items()}
            twice = 2 * wall["alone"]
            print(f"| {r} | " + " | ".join(f"{wall[arm]:.1f}" for arm in arms)
                  + f" | {wall['pair'] / twice:.2f} | {wall['pair passive'] / twice:.2f} | "
                    f"{wall['pair pinned'] / twice:.2f} |", flush=True)


if __name__ == "__main__":
    main()
