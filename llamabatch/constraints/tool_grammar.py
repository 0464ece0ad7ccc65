"""The token mask that makes a tool call valid by construction: a Lark grammar for llguidance
over a template's call syntax (constraints/tool_syntax.py), Hermes/Qwen's by default:

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

where NAME is one of the offered tools and the arguments are JSON valid against that tool's
`parameters` (each compiled by llguidance's %json as its own root, so a tool's `$ref`s resolve
as they would in `json_schema`; closed to their listed properties the same way).

- required / a named tool: the answer is one call (or several with parallel_tool_calls) from
  the first token, and nothing else;
- auto: free text until the syntax's opener is written (a lazy lexeme: it ends at the first
  opener), then the call is masked as above; text may follow a call, and further calls with
  parallel_tool_calls;
- none: no grammar at all (tool_grammar returns None).

The text is a LarkGrammar, a str marked as built here: SamplingParams.grammar takes it past
the GBNF guard (its schemas went through the json_schema guard instead), and only llguidance
compiles it (llama/sampling/mask_grammar.py). A line's own `grammar` text is never one. A request's
grammar is built before the engine's template is known, in Hermes' syntax; the engine that
renders the prompt rebuilds it in its template's syntax (ToolGrammar.for_syntax).
"""
from __future__ import annotations

import json
from typing import Iterable

from .schema_prepare import prepared_schema_text
from .tool_syntax import HERMES, ToolSyntax, syntax_named

OPEN, CLOSE = HERMES.trigger, HERMES.closer.strip()
# llguidance's JSON options as json_schema gets them (llama/mask_grammar.JSON_OPTIONS): no free
# whitespace, so separators are forced text.
_JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class LarkGrammar(str):
    """A Lark grammar for llguidance that llamabatch built itself (see the module's docstring)."""

    syntax: str | None = None  # the call syntax of a tool grammar


class ToolGrammar(LarkGrammar):
    """A tool call grammar that knows what it was built from, so the engine can rebuild it in
    its template's syntax."""

    def __new__(cls, text: str, tools: list, mode: str, parallel: bool, syntax: ToolSyntax) -> "ToolGrammar":
        grammar = super().__new__(cls, text)
        grammar.tools, grammar.mode, grammar.parallel, grammar.syntax = tools, mode, parallel, syntax.name
        return grammar

    def __getnewargs__(self):  # pickled (to an engine child or a Ray worker) with what it was built from
        return str(self), self.tools, self.mode, self.parallel, syntax_named(self.syntax)

    def for_syntax(self, syntax: ToolSyntax) -> "ToolGrammar":
        if syntax.name == self.syntax:
            return self
        return tool_grammar(self.tools, self.mode, self.parallel, syntax)


def _lit(text: str) -> str:
    return json.dumps(text)


def _seq(*parts: str) -> str:
    """Grammar items in order, empty literals left out (Lark refuses "")."""
    return " ".join(p for p in parts if p and p != '""')


def tool_grammar(tools: Iterable[tuple[str, dict]], mode: str, parallel: bool,
                 syntax: ToolSyntax = HERMES) -> ToolGrammar | None:
    """The grammar for `tools` ((name, parameters schema) pairs, those a call may name) under
    `mode` (none, auto or required) in `syntax`, or None for none. Raises InvalidRequest for a
    schema the json_schema guard refuses."""
    tools = list(tools)
    if mode == "none" or not tools:
        return None
    bodies, rests, rules = [], [], []
    for i, (name, parameters) in enumerate(tools):
        schema = json.loads(prepared_schema_text(parameters))
        if schema is True or schema == {}:
            schema = {}  # any arguments: still an object, as every call's arguments are
        if isinstance(schema, dict):
            schema.setdefault("type", "object")
            schema["x-guidance"] = _JSON_OPTIONS
        head = syntax.call_head(name)
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
        bodies.append(f'{_lit(head)} args_{i} "}}"')
        if syntax.trigger_in_json:  # what follows the trigger, when the trigger opens the JSON itself
            rests.append(f'{_lit(head[len(syntax.trigger):])} args_{i} "}}"')
    calls = _seq("call_json", f'({_lit(syntax.between)} call_json)*' if parallel else "")
    lines = ["%llguidance {}"]
    if mode == "required":
        if syntax.listed:
            lines.append("start: " + _seq(_lit(syntax.trigger + syntax.after_trigger + "["), calls, '"]"'))
        else:
            lines.append(f'start: call ({_lit(syntax.between)} call)*' if parallel else "start: call")
            lines.append("call: " + _seq(_lit("" if syntax.trigger_in_json else syntax.trigger + syntax.after_trigger),
                                         "call_json", _lit(syntax.closer)))
    else:  # auto: the struct-tag shape llguidance documents for tool calling (a lazy trigger)
        lines.append("start: free_call* free_text" if parallel else "start: free_call? free_text")
        lines.append("free_text: TEXT")
        lines.append(f"opener[lazy]: TEXT {_lit(syntax.trigger)}")
        if syntax.listed:
            lines.append("free_call: " + _seq("opener", _lit(syntax.after_trigger + "["), calls, '"]"'))
        elif syntax.trigger_in_json:
            lines.append("free_call: opener call_rest")
            lines.append("call_rest: " + " | ".join(rests))
        else:
            lines.append("free_call: " + _seq("opener", _lit(syntax.after_trigger), "call_json", _lit(syntax.closer)))
        lines.append("TEXT: /(.|\\n)*/")
    lines.append("call_json: " + " | ".join(bodies))
    lines.extend(rules)
    return ToolGrammar("\n".join(lines) + "\n", tools, mode, parallel, syntax)
