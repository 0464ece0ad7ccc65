"""The ways chat templates teach a model to write a tool call, and which one a template teaches.

    hermes   <tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>   (Qwen, Hermes, the fallback)
    llama3   {"name": "N", "parameters": {...}}                             (Llama 3.x's JSON calls)
    mistral  [TOOL_CALLS][{"name": "N", "arguments": {...}}, ...]           (Mistral's v3 tokenizer)

A call is one JSON object of a name and its arguments; a syntax says what the object's arguments
key is, what text opens a call (in `auto` the model writes freely until it: `trigger`), what
closes it, what stands between two calls, and whether the calls sit in one JSON array after the
opener (mistral). constraints/tool_grammar.py builds the token mask from it;
openai_format/tool_calls.py reads the calls back out with the same value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    trigger: str  # the text that starts a call; in `auto` the answer is free text until it
    args_key: str = "arguments"
    after_trigger: str = ""  # text forced between the trigger and the call's JSON
    closer: str = ""  # text after a call's JSON ("" : the call ends where its JSON closes)
    between: str = "\n"  # between two calls (inside the array for a listed syntax)
    listed: bool = False  # the calls are one JSON array after the trigger
    trigger_in_json: bool = False  # the trigger is the start of the call's JSON object itself

    def call_head(self, name: str) -> str:
        """A call's JSON up to its arguments' value."""
        return f'{{"name": "{name}", "{self.args_key}": '


HERMES = ToolSyntax("hermes", trigger="<tool_call>", after_trigger="\n", closer="\n</tool_call>")
LLAMA3 = ToolSyntax("llama3", trigger='{"name": "', args_key="parameters", trigger_in_json=True)
MISTRAL = ToolSyntax("mistral", trigger="[TOOL_CALLS]", between=", ", listed=True)
SYNTAXES = {s.name: s for s in (HERMES, LLAMA3, MISTRAL)}

# What gives a template's syntax away in its text, checked in this order; a template that reads
# tools and matches none is taught Hermes' syntax by the engine's own words (the fallback's).
_TELLS = (
    (MISTRAL, re.compile(r"\[TOOL_CALLS\]")),
    (HERMES, re.compile(r"<tool_call>")),
    (LLAMA3, re.compile(r'<\|python_tag\|>|"parameters": dictionary of argument name')),
)


def syntax_of_template(text: str | None) -> ToolSyntax:
    """The call syntax a Jinja template's text teaches (HERMES when it names none)."""
    for syntax, tell in _TELLS:
        if text and tell.search(text):
            return syntax
    return HERMES


def syntax_named(name: str | None) -> ToolSyntax:
    """The syntax called `name` (None or an unknown name: HERMES, the fallback's)."""
    return SYNTAXES.get(name or "", HERMES)
