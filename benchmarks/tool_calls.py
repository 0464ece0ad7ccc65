"""Tool calls: how many are valid against their tool's schema, and what a batch of forced calls
costs against the same prompts with the tool's schema as `response_format`.

    python benchmarks/tool_calls.py validity          # 20 tool sets x auto/required/named x streamed or not
    python benchmarks/tool_calls.py speed --rounds 3  # A B pairs: response_format lines, tool lines

validity: every call read out of every answer (records' `tool_calls`, and a stream's calls read
piece by piece as `serve` reads them) is checked with jsonschema against its tool's parameters,
on SmolLM2 through tests/templates/hermes_tools.jinja and Gemma 3 through the fallback; it
prints calls valid / calls made per model and mode. speed: the same questions as OpenAI chat
lines, (1) with the chosen tool's schema as `response_format`, (3) with the tool and `tool_choice:
required`, each line answered in full (greedy), and between them the schema lines on the tool
lines' own prompts (the tools written in by the template), so that only the constraint differs;
it prints the wall time of each and the ratios per round (>= 1: tools as fast), and beside them the
tokens evaluated and ticks: a call's markup (`<tool_call>\n{"name": ..., "arguments": `) is
tokens the model must have in its context, forced but evaluated like sampled ones, so the last
ratio, wall time per evaluated token, says what the constraint itself costs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema

from _bench import machine_line, model_path, say

HERE = Path(__file__).resolve().parent
HERMES = str(HERE.parent / "tests" / "templates" / "hermes_tools.jinja")


def fn(name: str, properties: dict, required: list | None = None, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required if required is not None else list(properties)}}}


S = {"type": "string", "maxLength": 24}
TOOL_SETS: list[tuple[str, list[dict]]] = [
    ("What is the weather in Paris?", [fn("get_weather", {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}})]),
    ("Book a table for 4 at Luigi's at 8pm.", [fn("book_table", {"restaurant": S, "people": {"type": "integer", "minimum": 1, "maximum": 20}, "time": S})]),
    ("Plan lunch with Ana on the 3rd at noon.", [fn("create_event", {
        "title": S, "when": {"type": "object", "properties": {"day": {"type": "integer", "minimum": 1, "maximum": 31},
                                                              "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                             "required": ["day", "hour"]},
        "guests": {"type": "array", "items": S, "maxItems": 3}}, ["title", "when"])]),
    ("Convert 30 euros to dollars.", [fn("convert", {"amount": {"type": "number"}, "from": {"enum": ["EUR", "USD", "GBP"]}, "to": {"enum": ["EUR", "USD", "GBP"]}})]),
    ("Search for cheap flights to Rome.", [fn("search", {"query": S, "limit": {"type": "integer", "minimum": 1, "maximum": 50}}, ["query"]),
                                           fn("get_weather", {"city": S})]),
    ("Send Bob an email saying hi.", [fn("send_email", {"to": S, "subject": S, "body": {"type": "string", "maxLength": 60}}, ["to", "body"])]),
    ("Turn the living room lights to 40%.", [fn("set_light", {"room": {"enum": ["kitchen", "living room", "bedroom"]}, "level": {"type": "integer", "minimum": 0, "maximum": 100}})]),
    ("Add milk, eggs and bread to my list.", [fn("add_items", {"items": {"type": "array", "items": S, "minItems": 1, "maxItems": 5}})]),
    ("What time is it in Tokyo?", [fn("get_time", {"tz": S}), fn("get_weather", {"city": S}), fn("search", {"query": S})]),
    ("Remind me to call mom tomorrow.", [fn("reminder", {"text": S, "when": {"type": "object", "properties": {"days_from_now": {"type": "integer", "minimum": 0, "maximum": 30}}, "required": ["days_from_now"]}})]),
    ("Translate 'good morning' to Spanish.", [fn("translate", {"text": S, "target": {"enum": ["es", "fr", "de", "it"]}})]),
    ("Find Italian restaurants near me, 4 stars or more.", [fn("find_places", {"kind": S, "min_stars": {"type": "number", "minimum": 0, "maximum": 5}, "open_now": {"type": "boolean"}}, ["kind"])]),
    ("Create a user named Kim, age 31, admin.", [fn("create_user", {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}, "roles": {"type": "array", "items": {"enum": ["admin", "editor", "viewer"]}, "maxItems": 3}})]),
    ("Play some jazz in the kitchen.", [fn("play_music", {"genre": S, "room": S}), fn("set_light", {"room": S, "level": {"type": "integer"}})]),
    ("How far is it from Lyon to Nice?", [fn("distance", {"from": S, "to": S, "unit": {"enum": ["km", "mi"]}}, ["from", "to"])]),
    ("Order two large pizzas, one margherita.", [fn("order", {"lines": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"item": S, "size": {"enum": ["small", "large"]}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["item", "qty"]}}})]),
    ("Rate the movie Alien 5 stars.", [fn("rate", {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5}})]),
    ("Set a timer for 10 minutes.", [fn("timer", {"minutes": {"type": "integer", "minimum": 1, "maximum": 120}, "label": S}, ["minutes"])]),
    ("Look up the stock price of ACME.", [fn("quote", {"symbol": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}), fn("search", {"query": S})]),
    ("Log a 5 km run this morning.", [fn("log_workout", {"kind": {"enum": ["run", "swim", "bike"]}, "distance_km": {"type": "number", "minimum": 0, "maximum": 100},
                                                          "notes": {"type": ["string", "null"], "maxLength": 30}}, ["kind", "distance_km"])]),
]


def chat_line(i: int, question: str, tools: list, choice, max_tokens: int) -> str:
    body = {"messages": [{"role": "user", "content": question}], "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": False, "max_tokens": max_tokens}
    return json.dumps({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})


def check_calls(calls: list[dict], schemas: dict, tally: list[int]) -> None:
    for call in calls:
        function = call["function"] if "function" in call else call
        arguments = function["arguments"]
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        tally[1] += 1
        try:
            jsonschema.validate(arguments, schemas[function["name"]])
            tally[0] += 1
        except (jsonschema.ValidationError, KeyError) as exc:
            say(f"  invalid call {function['name']} {arguments}: {str(exc).splitlines()[0]}")


def validity(models: list[tuple[str, str, str | None]], max_tokens: int) -> None:
    from llamabatch import Engine, EngineConfig, SamplingParams
    from llamabatch.constraints.tool_syntax import syntax_named
    from llamabatch.openai_format import LineParser, ToolCallSplitter, build_record

    parser = LineParser(SamplingParams(temperature=0), input_format="jsonl")
    print("| model | mode | answers | calls valid / calls made (whole) | calls valid / calls made (streamed) |")
    print("| --- | --- | --- | --- | --- |")
    for label, path, template in models:
        with Engine(EngineConfig(model=path, n_parallel=8, n_ctx=8 * 1024, threads=2, chat_template=template)) as engine:
            for mode in ("auto", "required", "named"):
                whole, streamed = [0, 0], [0, 0]
                items, schemas = [], []
                for i, (question, tools) in enumerate(TOOL_SETS):
                    choice = {"type": "function", "function": {"name": tools[-1]["function"]["name"]}} if mode == "named" else mode
                    items.append(parser.parse(chat_line(i, question, tools, choice, max_tokens), i + 1))
                    schemas.append({t["function"]["name"]: t["function"]["parameters"] for t in tools})
                handles = [engine.submit(it.prompt, it.params, stream=True) for it in items]
                for item, handle, schema in zip(items, handles, schemas):
                    deltas = [d.text for d in handle]
                    result = handle.result()
                    message = build_record(item, result, "m")["response"]["body"]["choices"][0]["message"]
                    check_calls(message.get("tool_calls") or [], schema, whole)
                    splitter = ToolCallSplitter(syntax_named(result.tool_syntax))
                    events = [e for text in deltas for e in splitter.feed(text)] + splitter.finish()
                    check_calls([v for kind, v in events if kind == "call"], schema, streamed)
                print(f"| {label} | {mode} | {len(items)} | {whole[0]} / {whole[1]} | {streamed[0]} / {streamed[1]} |", flush=True)


def speed(path: str, template: str | None, prompts: int, rounds: int, max_tokens: int, slots: int,
          kv_unified: bool | None) -> None:
    from llamabatch import Engine, EngineConfig, SamplingParams
    from llamabatch.openai_format import LineParser

    parser = LineParser(SamplingParams(temperature=0), input_format="jsonl")
    question, tools = TOOL_SETS[2]  # nested object, array, required and optional fields
    schema = tools[0]["function"]["parameters"]
    asks = [f"{question} (request {i})" for i in range(prompts)]
    schema_lines = [json.dumps({"custom_id": str(i), "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "user", "content": q}], "max_tokens": max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "create_event", "schema": schema}}}})
        for i, q in enumerate(asks)]
    tool_lines = [chat_line(i, q, tools, "required", max_tokens) for i, q in enumerate(asks)]
    schema_items = [parser.parse(text, i + 1) for i, text in enumerate(schema_lines)]
    tool_items = [parser.parse(text, i + 1) for i, text in enumerate(tool_lines)]
    config = EngineConfig(model=path, n_parallel=slots, n_ctx=slots * 1024, threads=2, chat_template=template)
    if kv_unified is not None:
        config = config.replace(kv_unified=kv_unified)
    with Engine(config) as engine:
        # the tool lines' own prompts (the template writes the tools into them), as token ids
        tool_prompts = [engine.tokenize(engine.render_chat(it.prompt), special=True) for it in tool_items]
        arms = {"json_schema, its own prompt": [(it.prompt, it.params) for it in schema_items],
                "json_schema, the tool prompt": [(p, it.params) for p, it in zip(tool_prompts, schema_items)],
                "tools required": [(it.prompt, it.params) for it in tool_items]}

        def batch(requests: list) -> tuple[float, int, int, int]:
            """Wall seconds, completion tokens, tokens evaluated (prompt and answer), ticks."""
            before, start = engine.stats(), time.perf_counter()
            results = [h.result() for h in [engine.submit(p, params, stream=False) for p, params in requests]]
            wall, after = time.perf_counter() - start, engine.stats()
            evaluated = (after.decode_tokens + after.prefill_tokens) - (before.decode_tokens + before.prefill_tokens)
            return wall, sum(r.usage.completion_tokens for r in results), evaluated, after.ticks - before.ticks

        for requests in arms.values():  # warm-up: grammars compiled, prefixes cached alike
            batch(requests[:slots])
        print("| round | " + " | ".join(f"{name}: s (tokens; evaluated, ticks)" for name in arms)
              + " | ratio (2)/(3) | ratio (1)/(3) | ms per evaluated token, (2)/(3) |")
        print("|" + " --- |" * (len(arms) + 4))
        for r in range(1, rounds + 1):
            got = [batch(requests) for requests in arms.values()]
            cells = " | ".join(f"{t:.2f} ({n}; {e}, {k})" for t, n, e, k in got)
            per_token = (got[1][0] / got[1][2]) / (got[2][0] / got[2][2])
            print(f"| {r} | {cells} | {got[1][0] / got[2][0]:.3f} | {got[0][0] / got[2][0]:.3f} | {per_token:.3f} |",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["validity", "speed"])
    ap.add_argument("--rounds", type=int, default=3, help="A B pairs for speed (default 3)")
    ap.add_argument("--prompts", type=int, default=32, help="lines per batch for speed (default 32)")
    ap.add_argument("--slots", type=int, default=8, help="engine slots for speed (default 8)")
    ap.add_argument("--max-tokens", type=int, default=80, help="max_tokens per line (default 80)")
    ap.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2", help="speed's model (default smollm2)")
    ap.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=None,
                    help="speed's KV layout (default: the engine's)")
    args = ap.parse_args()
    from llamabatch.models.resolve import resolve_model_ref

    smollm2 = resolve_model_ref("smollm2").path
    gemma = model_path(None)
    say(machine_line(smollm2))
    if args.what == "validity":
        validity([("SmolLM2 (hermes_tools.jinja)", smollm2, HERMES), ("Gemma 3 (fallback)", gemma, None)], args.max_tokens)
    else:
        path, template = (smollm2, HERMES) if args.model == "smollm2" else (gemma, None)
        speed(path, template, args.prompts, args.rounds, args.max_tokens, args.slots, args.kv_unified)
    return None


if __name__ == "__main__":
    sys.exit(main())
