"""`llamabatch serve`'s batches side by side: a small batch created while a big one runs.

    python benchmarks/serve_batches_side_by_side.py [--big-lines 2000] [--small-lines 10] [--tokens 16]
                                                    [--small-after 0.25] [--slots 8] [--threads 2]
                                                    [--no-isolate] [-m MODEL | --fake] [--rounds 2]

Each round is one A B pair on one server (the openai SDK creates each batch from an uploaded
file and polls it every 0.05 s; upload and download are not timed):

  A: the small batch alone, then the big batch alone;
  B: the big batch, and the small one created once --small-after of the big one's lines are done.

Two ratios per pair: the small batch's time beside the big one / alone (target <= 3), and the
big batch's wall with the small one beside it / (alone + the small one's time alone, its own
work) (target <= 1.05). Every line generates exactly --tokens tokens (ignore_eos). --fake runs
the scripted fake runner (tests/fake_runner.py, a step of --fake-step s) instead of a model: the
server's own sharing without llama.cpp's figures. Measures and prints; asserts nothing on time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import Pairs, essay_prompts, machine_line, model_path, say, served, workload_args

TESTS = str(Path(__file__).resolve().parent.parent / "tests")
COMPLETIONS = "/v1/completions"
POLL_S = 0.05


def write_batch(path: Path, n: int, tokens: int, prefix: str) -> Path:
    with open(path, "w") as f:
        for i, prompt in enumerate(essay_prompts(n)):
            body = {"model": "any", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
            f.write(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": COMPLETIONS, "body": body}) + "\n")
    return path


class Batches:
    """The server's client, with each batch file uploaded once."""

    def __init__(self, client: Any, big: Path, small: Path, lines: dict[str, int]):
        self.client = client
        self.files = {name: self._upload(path) for name, path in (("big", big), ("small", small))}
        self.lines = lines

    def _upload(self, path: Path) -> str:
        with open(path, "rb") as f:
            return self.client.files.create(file=(path.name, f), purpose="batch").id

    def create(self, name: str) -> tuple[str, float]:
        batch = self.client.batches.create(input_file_id=self.files[name], endpoint=COMPLETIONS,
                                           completion_window="24h")
        return batch.id, time.perf_counter()

    def wait(self, name: str, batch_id: str, started: float) -> float:
        """Seconds from the batch's creation to its completion, checked whole."""
        while True:
            batch = self.client.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(POLL_S)
        seconds = time.perf_counter() - started
        if batch.status != "completed" or batch.request_counts.completed != self.lines[name]:
            raise SystemExit(f"{name} batch: {batch.status} {batch.request_counts}")
        return seconds

    def alone(self, name: str) -> float:
        return self.wait(name, *self.create(name))

    def side_by_side(self, small_after: float) -> tuple[float, float, int]:
        """(big's seconds, small's seconds, big's lines done when the small one was created)."""
        big_id, big_started = self.create("big")
        want = int(small_after * self.lines["big"])
        while True:
            done = self.client.batches.retrieve(big_id).request_counts.completed
            if done >= want:
                break
            time.sleep(POLL_S)
        small_s = self.alone("small")
        return self.wait("big", big_id, big_started), small_s, done


def open_engine(args: argparse.Namespace) -> tuple[Any, str]:
    """The engine as `llamabatch serve` opens it, and what it is in words."""
    from llamabatch import EngineConfig, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.tokens)
    if args.fake:
        sys.path.insert(0, TESTS)
        from fake_runner import FakeRunner
        from llamabatch import Engine

        runner = FakeRunner(n_slots=args.slots, slot_ctx=512, n_batch=512, step_delay=args.fake_step)
        config = EngineConfig(n_parallel=args.slots, n_batch=512, chunk_size=64, n_ctx=512 * args.slots)
        return Engine(config, runner=runner, default_params=params), f"fake runner, {args.fake_step * 1000:.0f} ms a step"
    from llamabatch.engines import open_engine as open_real

    model = model_path(args.model)
    config = EngineConfig(model=model, n_parallel=args.slots, n_ctx=512 * args.slots, threads=args.threads)
    engine = open_real(config, params, isolated=args.isolate)
    return engine, (f"{os.path.basename(model)}, {args.threads} threads, "
                    f"{'supervised child' if args.isolate else 'in-process engine'}; {machine_line(model)}")


def figures(args: argparse.Namespace) -> None:
    engine, what = open_engine(args)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with served(engine, str(workdir / "data")) as (client, _port):
            batches = Batches(client, write_batch(workdir / "big.jsonl", args.big_lines, args.tokens, "b"),
                              write_batch(workdir / "small.jsonl", args.small_lines, args.tokens, "s"),
                              {"big": args.big_lines, "small": args.small_lines})
            print(f"a {args.small_lines}-line batch created once {args.small_after:.0%} of a {args.big_lines}-line "
                  f"batch is done, lines of {args.tokens} tokens, {args.slots} slots; {what}")
            small_pairs, big_pairs = Pairs(), Pairs()
            for r in range(1, args.rounds + 1):
                say(f"round {r}: alone")
                small_alone = batches.alone("small")
                big_alone = batches.alone("big")
                say(f"round {r}: side by side")
                big_beside, small_beside, done = batches.side_by_side(args.small_after)
                small_ratio = small_pairs.add(small_alone, small_beside)
                big_ratio = big_pairs.add(big_alone + small_alone, big_beside)
                print(f"round {r}: small alone {small_alone:.2f} s, beside the big one {small_beside:.2f} s "
                      f"(created at its line {done}) -> {small_ratio:.2f}x (target <= 3); big alone "
                      f"{big_alone:.2f} s + small alone {small_alone:.2f} s = {big_alone + small_alone:.2f} s, with "
                      f"the small one beside it {big_beside:.2f} s -> {big_ratio:.3f}x (target <= 1.05)")
            print(f"median over {args.rounds} pairs: small {small_pairs.median():.2f}x alone "
                  f"({', '.join(f'{x:.2f}' for x in small_pairs.ratios)}); big {big_pairs.median():.3f}x alone + "
                  f"small ({', '.join(f'{x:.3f}' for x in big_pairs.ratios)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-lines", type=int, default=2000, help="lines of the big batch (default 2000)")
    ap.add_argument("--small-lines", type=int, default=10, help="lines of the small batch (default 10)")
    ap.add_argument("--small-after", type=float, default=0.25,
                    help="fraction of the big batch's lines done when the small one is created (default 0.25)")
    workload_args(ap, tokens=16, slots=8, threads=2, rounds=2, model=True)
    ap.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                    help="llama.cpp in a supervised child, as serve runs it (default); --no-isolate: in this process")
    ap.add_argument("--fake", action="store_true", help="the scripted fake runner instead of a model")
    ap.add_argument("--fake-step", type=float, default=0.005, help="the fake runner's seconds a step (default 0.005)")
    args = ap.parse_args()
    if not 0 <= args.small_after < 1:
        ap.error("--small-after is a fraction from 0 to below 1")
    if min(args.big_lines, args.small_lines, args.rounds, args.slots, args.tokens) < 1:
        ap.error("--big-lines, --small-lines, --rounds, --slots and --tokens must be at least 1")
    figures(args)
    say("done")


if __name__ == "__main__":
    main()
