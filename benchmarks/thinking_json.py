"""JSON-schema lines on a thinking template: how many answers are valid JSON in `content` with the
reasoning apart, and how many reasoning tokens budget 0 and enable_thinking false generate.

On each model of -m (default: smollm2,gemma), with tests/templates/thinking.jinja (ChatML that
opens `<think>` in its generation prompt: the answer starts inside the block), --lines lines of
the tests' extraction file (tests/structured_schemas.py: 20 schemas, chat prompts), greedy, run
three ways on one engine:
  think   the line's json_schema, --budget reasoning tokens (the engine closes the block itself
          where the model does not)
  zero    the same with reasoning_budget 0
  off     the same with chat_template_kwargs {"enable_thinking": false}
Prints, per model and way: answers whose content parses as JSON valid against the line's schema
(jsonschema), of all and of those that ended by themselves (an answer cut by max_tokens is cut
JSON), answers with reasoning text, total reasoning tokens, finish reasons.
A measurement, not a test: it never asserts.

Usage:
  python benchmarks/thinking_json.py [-m smollm2,gemma] [--lines 20] [--budget 48] [--max-tokens 160]
      [--ways think,zero,off]
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
from pathlib import Path

from _bench import machine_line, model_path, say

from llamabatch import Engine, EngineConfig, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = str(ROOT / "tests" / "templates" / "thinking.jinja")


def _schemas():
    spec = importlib.util.spec_from_file_location("structured_schemas", ROOT / "tests" / "structured_schemas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def valid(text: str | None, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text or ""), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def measure(model: str, lines, schemas: dict, args) -> None:
    ways = {"think": {"reasoning_budget": args.budget}, "zero": {"reasoning_budget": 0},
            "off": {"chat_template_kwargs": {"enable_thinking": False}}}
    ways = {way: fields for way, fields in ways.items() if way in args.ways.split(",")}
    config = EngineConfig(model=model_path(model), n_parallel=8, n_ctx=8 * 1024, chat_template=TEMPLATE)
    with Engine(config) as engine:
        for way, fields in ways.items():
            handles = [(name, engine.submit(messages, SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                                                     json_schema=schemas[name], **fields)))
                       for name, messages in lines]
            results = [(name, h.result()) for name, h in handles]
            ok = sum(valid(r.text, schemas[name]) for name, r in results)
            stopped = [(name, r) for name, r in results if r.finish_reason == "stop"]
            ok_stopped = sum(valid(r.text, schemas[name]) for name, r in stopped)
            reasoned = sum(bool(r.reasoning) for _, r in results)
            tokens = sum(r.usage.reasoning_tokens or 0 for _, r in results)
            reasons = collections.Counter(r.finish_reason for _, r in results)
            print(f"{model:8} {way:5}  valid JSON in content {ok}/{len(results)} (of those that stopped "
                  f"{ok_stopped}/{len(stopped)})  with reasoning {reasoned}/"
                  f"{len(results)}  reasoning tokens {tokens}  finish {dict(reasons)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--models", default="smollm2,gemma")
    ap.add_argument("--lines", type=int, default=20)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--ways", default="think,zero,off")
    args = ap.parse_args()
    module = _schemas()
    lines = module.lines(args.lines)
    for model in args.models.split(","):
        say(f"{model}: {machine_line(model)}")
        measure(model, lines, module.SCHEMAS, args)


if __name__ == "__main__":
    main()
