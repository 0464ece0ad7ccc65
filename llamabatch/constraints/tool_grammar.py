"""The token mask that makes a tool call valid by construction: a Lark grammar for llguidance
over the Hermes/Qwen call syntax

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

where NAME is one of the offered tools and the arguments are JSON valid against that tool's
`parameters` (each compiled by llguidance's %json as its own root, so a tool's `$ref`s resolve
as they would in `json_schema`; closed to their listed properties the same way).

- required / a named tool: the answer is one call (or several, one a line, with
  parallel_tool_calls) from the first token, and nothing else;
- auto: free text until the text `<tool_call>` is written (a lazy lexeme: it ends at the
  first opener), then the call is masked as above; text may follow a call, and further calls
  with parallel_tool_calls;
- none: no grammar at all (tool_request_grammar returns None).

The text is a LarkGrammar, a str marked as built here: SamplingParams.grammar takes it past
the GBNF guard (its schemas went through the json_schema guard instead), and only llguidance
compiles it (llama/mask_grammar.py). A line's own `grammar` text is never one.
"""
from __future__ import annotations

import json
from typing import Iterable

from .schema_prepare import prepared_schema_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# llguidance's JSON options as json_schema gets them (llama/mask_grammar.JSON_OPTIONS): no free
# whitespace, so separators are forced text.
_JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class LarkGrammar(str):
    """A Lark grammar for llguidance that llamabatch built itself (see the module's docstring)."""


def tool_grammar(tools: Iterable[tuple[str, dict]], mode: str, parallel: bool) -> LarkGrammar | None:
    """The grammar for `tools` ((name, parameters schema) pairs, those a call may name) under
    `mode` (none, auto or required), or None for none. Raises InvalidRequest for a schema the
    json_schema guard refuses."""
    tools = list(tools)
    if mode == "none" or not tools:
        return None
    bodies = []
    rules = []
    for i, (name, parameters) in enumerate(tools):
        schema = json.loads(prepared_schema_text(parameters))
        if schema is True or schema == {}:
            schema = {}  # any arguments: still an object, as every call's arguments are
        if isinstance(schema, dict):
            schema.setdefault("type", "object")
            schema["x-guidance"] = _JSON_OPTIONS
        head = json.dumps(f'{{"name": "{name}", "arguments": ')
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
        bodies.append(f'{head} args_{i} "}}"')
    lines = ["%llguidance {}"]
    call = f'call: {json.dumps(OPEN + chr(10))} call_json {json.dumps(chr(10) + CLOSE)}'
    if mode == "required":
        lines.append('start: call ("\\n" call)*' if parallel else "start: call")
        lines.append(call)
    else:  # auto: the struct-tag shape llguidance documents for tool calling (a lazy trigger)
        lines.append("start: free_call* free_text" if parallel else "start: free_call? free_text")
        lines.append("free_text: TEXT")
        lines.append(f"opener[lazy]: TEXT {json.dumps(OPEN)}")
        lines.append(f"free_call: opener {json.dumps(chr(10))} call_json {json.dumps(chr(10) + CLOSE)}")
        lines.append("TEXT: /(.|\\n)*/")
    lines.append("call_json: " + " | ".join(bodies))
    lines.extend(rules)
    return LarkGrammar("\n".join(lines) + "\n")
