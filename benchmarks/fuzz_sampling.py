"""Sampling-parameter fuzzer on the real engine: random combinations of every sampling field
(grammars, JSON schemas, logit biases, stops with odd Unicode, min/max tokens, penalties,
mirostat, DRY, XTC, logprobs, extreme numbers), each run on the bundled model inside a
`llamabatch serve-stdin` child process, so a combination that aborts or hangs llama.cpp
ends a child, not the fuzzer.

    python benchmarks/fuzz_sampling.py [--requests 400] [--seed 1] [--out fuzz-findings.jsonl]

When a child dies, every request it had in flight is a suspect; each suspect then runs
alone in a fresh child, and the ones that kill it again are reported (and written to
--out, one JSON line each, for a regression test). Also reported: requests that got no
terminal event within --timeout seconds, and every error code seen with an example.
Exit 1 when anything crashed or hung.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import random
import subprocess
import sys
import threading
import time
from typing import Any

from _bench import llamabatch_command, machine_line, workload_args

PROMPTS = ["The capital of France is", "Write a haiku about rain.", "1, 2, 3,", "{", "Q: yes or no?\nA:",
           [{"role": "user", "content": "Say hello in JSON."}],
           [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Colour of sky?"}]]
GRAMMARS = ['root ::= "yes" | "no"', 'root ::= [0-9]+', 'root ::= "a"', 'root ::= ("x" | "y")* "."',
            'root ::= [^\\x00]{1,3}', 'root ::= "\u00e9\U0001F600"', "root ::= undefined-rule", "root ::= (",
            'root ::= "" ', 'root ::= [a-z]{0,0}', "", 'root ::= "a" root?']
SCHEMAS = [{"type": "object"}, {"type": "integer", "minimum": 5, "maximum": 3}, {"enum": []}, {"enum": [1, "a", None]},
           {"type": "string", "pattern": "[a"}, {"type": "string", "maxLength": 0}, {"$ref": "#/nowhere"},
           {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 1}, {"const": "x"},
           {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a", "b"]}, {"type": "nope"},
           {"anyOf": []}, True, "not a schema", '{"type": "string"}']
ODD = ["\n", "\u00e9", "e\u0301", "\U0001F600", "\u200b", "\ufffd", "\x00", "\t", ".", " ", "</s>", "<end_of_turn>",
       "\u202e", "\uffff", "a" * 200, "\U0010FFFF", "\\", '"']
EXTREME_FLOATS = [0.0, 1e-9, 0.5, 1.0, 2.0, 10.0, 1e9, 1e30, -1.0, -1e9, math.inf, -math.inf, math.nan]
EXTREME_INTS = [-2, -1, 0, 1, 2, 3, 64, 1000, 2**31 - 1, 2**31, 2**40]


def draw(rng: random.Random, n_vocab: int) -> dict[str, Any]:
    """One request: a few sampling fields, each with a plausible or an extreme value."""
    req: dict[str, Any] = {"max_tokens": rng.choice([1, 2, 3, 5, 8])}
    prompt = rng.choice(PROMPTS)
    req["messages" if isinstance(prompt, list) else "prompt"] = prompt

    def f(lo: float, hi: float) -> float:
        return rng.choice(EXTREME_FLOATS) if rng.random() < 0.12 else rng.uniform(lo, hi)

    def i(lo: int, hi: int) -> int:
        return rng.choice(EXTREME_INTS) if rng.random() < 0.12 else rng.randint(lo, hi)

    choices = {
        "temperature": lambda: f(0, 2), "top_k": lambda: i(0, 100), "top_p": lambda: f(0, 1),
        "min_p": lambda: f(0, 1), "typical_p": lambda: f(0, 1), "top_n_sigma": lambda: f(-1, 3),
        "repeat_penalty": lambda: f(0.5, 2), "presence_penalty": lambda: f(-2, 2),
        "frequency_penalty": lambda: f(-2, 2), "penalty_last_n": lambda: i(-1, 128),
        "dry_multiplier": lambda: f(0, 3), "dry_base": lambda: f(1, 3), "dry_allowed_length": lambda: i(0, 5),
        "dry_penalty_last_n": lambda: i(-1, 128),
        "dry_sequence_breakers": lambda: rng.sample(ODD + [""], rng.randint(0, 4)),
        "xtc_probability": lambda: f(0, 1), "xtc_threshold": lambda: f(0, 1),
        "mirostat": lambda: rng.choice([0, 2, 2, 1]), "mirostat_tau": lambda: f(0, 10), "mirostat_eta": lambda: f(0, 1),
        "seed": lambda: i(0, 2**32 - 1), "min_tokens": lambda: i(0, 10), "ignore_eos": lambda: rng.random() < 0.5,
        "logprobs": lambda: rng.choice([None, 0, 1, 5, 20, 21]),
        "stop": lambda: rng.sample(ODD, rng.randint(1, 4)),
        "grammar": lambda: rng.choice(GRAMMARS), "json_schema": lambda: rng.choice(SCHEMAS),
        "logit_bias": lambda: {str(rng.choice([0, 1, 2, 106, rng.randrange(n_vocab), n_vocab, -1])):
                               rng.choice([-math.inf, -100, -1, 0, 1, 100, math.inf, math.nan, 1e30])
                               for _ in range(rng.randint(1, 4))},
        "timeout": lambda: rng.choice([0.001, 0.5, 5.0, 1e9]),
    }
    for key in rng.sample(sorted(choices), rng.randint(1, 7)):
        req[key] = choices[key]()
    if "grammar" in req and "json_schema" in req and rng.random() < 0.7:
        del req["json_schema"]
    if ("grammar" in req or "json_schema" in req) and rng.random() < 0.3:
        # a constrained request that also bans end-of-generation (Gemma 3's EOG ids) or more:
        # how llama.cpp's grammar was once made to abort
        req["logit_bias"] = {str(t): -math.inf for t in (1, 106, 212, *rng.sample(range(n_vocab), 2))}
        req.setdefault("min_tokens", rng.choice([0, 2]))
    return req


def encode(req: dict[str, Any]) -> str:
    return json.dumps(req, allow_nan=True)  # NaN and Infinity: Python's JSON reader accepts them


class Child:
    """A serve-stdin child; collects terminal events per id on a thread."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(llamabatch_command("serve-stdin", *args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.done: dict[str, dict] = {}
        self.ready = threading.Event()
        self.cond = threading.Condition()
        self.stderr = b""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            event = json.loads(raw)
            with self.cond:
                if event["event"] == "ready":
                    self.ready.set()
                elif event["event"] in ("done", "error") and "id" in event and "op" not in event:
                    self.done[event["id"]] = event
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _read_err(self) -> None:
        self.stderr = self.proc.stderr.read()

    def send(self, req_id: str, req: dict[str, Any]) -> bool:
        try:
            self.proc.stdin.write((encode({"id": req_id, **req}) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_alone(req: dict[str, Any], child_args: list[str], timeout: float) -> str:
    """'ok', 'crash: <signal/exit>' or 'hang' for one request in a fresh child."""
    child = Child(child_args)
    if not child.ready.wait(120):
        child.proc.kill()
        return "child never became ready"
    child.send("alone", req)
    deadline = time.monotonic() + timeout
    with child.cond:
        while "alone" not in child.done and child.alive and time.monotonic() < deadline:
            child.cond.wait(0.2)
    if "alone" in child.done:
        child.close()
        return "ok"
    if child.alive:
        child.proc.kill()
        child.proc.wait()
        return "hang"
    child.proc.wait()
    return f"crash: exit {child.proc.returncode}: {_last_line(child.stderr)}"


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(nothing on stderr)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--inflight", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take before it counts as hung")
    workload_args(ap, threads=2)
    ap.add_argument("--out", default="fuzz-findings.jsonl")
    args = ap.parse_args()
    print(f"fuzz: {args.requests} requests, seed {args.seed}; {machine_line()}", flush=True)
    child_args = ["--n-parallel", "4", "--n-ctx", "2048", "--threads", str(args.threads), "--temperature", "0.8"]
    rng = random.Random(args.seed)
    n_vocab = 262144  # Gemma 3's; ids past it must be refused, not used
    requests = {f"r{k}": draw(rng, n_vocab) for k in range(args.requests)}
    codes: collections.Counter = collections.Counter()
    refused: collections.Counter = collections.Counter()
    examples: dict[str, tuple[dict, str]] = {}
    suspects: list[str] = []
    hung: list[str] = []
    finished = 0
    pending = list(requests)
    start = time.monotonic()
    while pending:
        child = Child(child_args)
        if not child.ready.wait(120):
            raise SystemExit(f"serve-stdin did not start: {_last_line(child.stderr)}")
        inflight: dict[str, float] = {}
        while (pending or inflight) and child.alive:
            while pending and len(inflight) < args.inflight:
                req_id = pending.pop(0)
                if not child.send(req_id, requests[req_id]):
                    pending.insert(0, req_id)
                    break
                inflight[req_id] = time.monotonic()
            with child.cond:
                child.cond.wait(0.2)
                for req_id in [r for r in inflight if r in child.done]:
                    event = child.done[req_id]
                    del inflight[req_id]
                    finished += 1
                    code = event["error"]["code"] if event["event"] == "error" else f"done:{event['finish_reason']}"
                    if event["event"] == "error":  # which field was refused, to see what reaches llama.cpp
                        refused[event["error"]["message"].split(" ")[0]] += 1
                    codes[code] += 1
                    examples.setdefault(code, (requests[req_id], event.get("error", {}).get("message", "")))
            now = time.monotonic()
            for req_id in [r for r, t in inflight.items() if now - t > args.timeout]:
                hung.append(req_id)
                del inflight[req_id]
                finished += 1
        if not child.alive:
            print(f"child died (exit {child.proc.returncode}) with {len(inflight)} in flight: "
                  f"{_last_line(child.stderr)}", file=sys.stderr)
            suspects.extend(inflight)
        else:
            child.close()
    crashes = []
    for req_id in suspects:
        verdict = run_alone(requests[req_id], child_args, args.timeout)
        print(f"suspect {req_id}: {verdict}", file=sys.stderr)
        if verdict != "ok":
            crashes.append((req_id, verdict))
    for req_id in hung:
        verdict = run_alone(requests[req_id], child_args, args.timeout)
        print(f"slow {req_id}: {verdict}", file=sys.stderr)
        if verdict != "ok":
            crashes.append((req_id, verdict))
    wall = time.monotonic() - start
    print(f"fuzz_sampling: {args.requests} requests (seed {args.seed}) in {wall:.0f}s: {finished} answered, "
          f"{len(suspects)} in flight when a child died, {len(hung)} over {args.timeout:.0f}s, "
          f"{len(crashes)} confirmed crash/hang")
    for code, count in codes.most_common():
        example, message = examples[code]
        print(f"  {count:5d}  {code}" + (f"  e.g. {message[:110]}" if message else ""))
    print("  errors by first word: " + ", ".join(f"{w} {n}" for w, n in refused.most_common(12)))
    with open(args.out, "w") as f:
        for req_id, verdict in crashes:
            f.write(json.dumps({"id": req_id, "verdict": verdict, "request": requests[req_id]}, allow_nan=True) + "\n")
            print(f"  FOUND {verdict}: {encode(requests[req_id])}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
