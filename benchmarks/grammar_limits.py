"""What each grammar backend does with grammars and schemas of a growing shape, the guard set aside.

    python benchmarks/grammar_limits.py SHAPE SIZE [SIZE ...] [--backend auto|llama] [--stack-kib 8192]
                                        [--timeout 60] [--tokens 4]

Each SIZE runs in a child process of its own (a crash there is a figure, not the end of the
measurement): one engine on the bundled model, the grammar guard's checks replaced by ones that
pass everything, one greedy request of SHAPE at SIZE submitted from a thread of --stack-kib of
stack (the thread that compiles a request's grammar), at most --tokens tokens. Prints per
size: ok and the seconds to the answer, the request's error, the signal that killed the child,
or `stalled` past --timeout. The figures behind constraints/gbnf_guard.py's and
constraints/schema_reach.py's bounds (docs/structured-output.md) come from here.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

SHAPES = {
    # rules referring to the next one: r0 ::= r1, ..., the last a string
    "chain": lambda n: ("grammar", "root ::= r0\n" + "".join(f"r{k} ::= r{k + 1}\n" for k in range(n)) + f'r{n} ::= "x"'),
    # the same chain, each reference after a character (not leftmost)
    "chain-after": lambda n: ("grammar", "root ::= r0\n" + "".join(f'r{k} ::= "x" r{k + 1} | "y"\n' for k in range(n))
                              + f'r{n} ::= "x"'),
    # definitions referring to the next: {"$ref": "#/$defs/d1"}, ... (the root is not a $ref itself:
    # llama-cpp-python's converter then never resolves the references inside the definitions)
    "ref-chain": lambda n: ("json_schema", {"anyOf": [{"$ref": "#/$defs/d0"}], "$defs": {
        **{f"d{k}": {"$ref": f"#/$defs/d{k + 1}"} for k in range(n)}, f"d{n}": {"type": "integer"}}}),
    "array-chain": lambda n: ("json_schema", {"anyOf": [{"$ref": "#/$defs/d0"}], "$defs": {
        **{f"d{k}": {"type": "array", "items": {"$ref": f"#/$defs/d{k + 1}"}} for k in range(n)},
        f"d{n}": {"type": "integer"}}}),
    "object-chain": lambda n: ("json_schema", {"anyOf": [{"$ref": "#/$defs/d0"}], "$defs": {
        **{f"d{k}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{k + 1}"}}} for k in range(n)},
        f"d{n}": {"type": "integer"}}}),
    "properties": lambda n: ("json_schema", {"type": "object", "properties": {f"p{k}": {"type": "integer"}
                                                                            for k in range(n)}}),
    "properties-required": lambda n: ("json_schema", {"type": "object", "required": [f"p{k}" for k in range(n)],
                                                      "properties": {f"p{k}": {"type": "integer"} for k in range(n)}}),
    # groups inside groups: root ::= ((("x")))
    "groups": lambda n: ("grammar", "root ::= " + "(" * n + '"x"' + ")" * n),
    # n objects of 400 optional properties each, side by side
    "objects": lambda n: ("json_schema", {"type": "object", "properties": {f"o{j}": {
        "type": "object", "properties": {f"p{k}": {"type": "integer"} for k in range(400)}} for j in range(n)}}),
    "count": lambda n: ("grammar", f'root ::= "x"{{{n}}}'),
    "count-word": lambda n: ("grammar", f'root ::= "word "{{{n}}}'),
    "count-rule": lambda n: ("grammar", f'root ::= r{{{n}}}\nr ::= "x" | "y"'),
    "count-class": lambda n: ("grammar", f'root ::= [a-z]{{{n}}}'),
    "count-range": lambda n: ("grammar", f'root ::= "x"{{0,{n}}}'),
    # nested counts through a rule reference, which llama.cpp's own check does not multiply
    "nested-counts": lambda n: ("grammar", f'root ::= r{{0,{n}}}\nr ::= "a"{{0,{n}}}'),
    "nested-exact": lambda n: ("grammar", f'root ::= r{{{n}}}\nr ::= "x"{{{n}}}'),
    "pattern": lambda n: ("json_schema", {"type": "string", "pattern": f"^(a{{0,{n}}}){{0,{n}}}$"}),
}

GUARD = [("llamabatch.params", "grammar_problem"), ("llamabatch.llama.sampling.samplers", "grammar_problem"),
         ("llamabatch.llama.sampling.samplers", "llama_grammar_problem"), ("llamabatch.llama.sampling.samplers", "size_problem"),
         ("llamabatch.llama.sampling.samplers", "schema_expansion_problem"), ("llamabatch.llama.sampling.mask_grammar", "size_problem"),
         ("llamabatch.constraints.schema_prepare", "schema_reach_problem")]


def child(args: argparse.Namespace) -> None:
    import importlib

    from llamabatch import Engine, EngineConfig, SamplingParams

    for module, name in GUARD:
        module = importlib.import_module(module)
        if hasattr(module, name):
            setattr(module, name, lambda *a, **k: None)
    kind, value = SHAPES[args.shape](args.size[0])
    params = SamplingParams(temperature=0, max_tokens=args.tokens, **{kind: value})
    with Engine(EngineConfig(n_parallel=1, n_ctx=512, threads=2, grammar_backend=args.backend)) as engine:
        handle: list = []
        threading.stack_size(args.stack_kib * 1024)
        start = time.perf_counter()
        submitter = threading.Thread(target=lambda: handle.append(engine.submit("Answer:", params, stream=False)))
        submitter.start()
        submitter.join()
        threading.stack_size(0)
        try:
            result = handle[0].result(timeout=args.timeout)
        except Exception as exc:  # the request's own error is a figure
            print(f"error {time.perf_counter() - start:.2f} s: {' '.join(str(exc).split())[:200]}", flush=True)
            os._exit(0)
        if result.finish_reason == "error":
            print(f"error {time.perf_counter() - start:.2f} s, mid-answer: {result.error[:200]}", flush=True)
        else:
            print(f"ok {time.perf_counter() - start:.2f} s: {result.text[:40]!r}", flush=True)
        os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("size", type=int, nargs="+")
    parser.add_argument("--backend", default="auto", choices=("auto", "llama"))
    parser.add_argument("--stack-kib", type=int, default=8192)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print(f"{args.shape}, backend {args.backend}, submitted from a thread of {args.stack_kib} KiB", flush=True)
    for size in args.size:
        command = [sys.executable, __file__, args.shape, str(size), "--backend", args.backend, "--stack-kib",
                   str(args.stack_kib), "--timeout", str(args.timeout), "--tokens", str(args.tokens), "--child"]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            print(f"{size:>9,}: stalled (killed after {time.perf_counter() - start:.0f} s)", flush=True)
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "error "))]
        if done.returncode < 0:
            said = " ".join(done.stderr.split())[-160:]
            print(f"{size:>9,}: killed by {signal.Signals(-done.returncode).name} ({said})", flush=True)
        else:
            print(f"{size:>9,}: {lines[-1] if lines else 'rc ' + str(done.returncode) + ' ' + done.stderr[-300:]}",
                  flush=True)


if __name__ == "__main__":
    main()
