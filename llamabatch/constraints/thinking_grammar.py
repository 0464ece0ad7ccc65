"""A constraint that starts after a reasoning block: a request's json_schema, tool call grammar or
GBNF grammar on a thinking model (core/thinking.py) becomes a Lark grammar for llguidance

    start: thought SPACE answer          the prompt opened the block (SPACE: up to 4 blanks)
    start: (opened SPACE)? answer        the model may open it as the first thing it writes

where the block is free text up to its first closer (a lazy lexeme, as tool_grammar.py's `auto`
opener) and `answer` the request's own constraint: `%json` for a schema (with json_schema's
options), `%lark { ... }` holding a tool grammar or a converted GBNF grammar as it is. The
engine's own closer, written when a thinking budget runs out, is text this grammar allows.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from .schema_prepare import prepared_schema_text
from .tool_grammar import _JSON_OPTIONS, LarkGrammar


def thinking_grammar(opener: str, closer: str, inside: bool, json_schema: Any = None,
                     grammar: str | None = None) -> LarkGrammar:
    """The grammar of (a reasoning block, then `json_schema` or `grammar`); InvalidRequest for
    a GBNF grammar llguidance cannot read."""
    if json_schema is not None:
        schema = json.loads(prepared_schema_text(json_schema))
        if isinstance(schema, dict):
            schema["x-guidance"] = _JSON_OPTIONS
        answer = f"answer: %json {json.dumps(schema)}"
    else:
        inner = str(grammar) if isinstance(grammar, LarkGrammar) else _gbnf_as_lark(grammar or "")
        answer = "answer: %lark {\n" + inner + "\n}"
    lines = ["%llguidance {}"]
    if inside:
        lines += ["start: thought SPACE answer", f"thought[lazy]: TEXT {json.dumps(closer)}"]
    else:
        lines += ["start: (opened SPACE)? answer", f"opened[lazy]: {json.dumps(opener)} TEXT {json.dumps(closer)}"]
    # at most 4 blank characters between the block and the answer (the engine's closer ends in "\n\n"):
    # unbounded, a model can write newlines until max_tokens and never start the answer
    lines += ["SPACE: /[ \\t\\r\\n]{0,4}/", "TEXT: /(.|\\n)*/", answer]
    built = LarkGrammar("\n".join(lines) + "\n")
    built.syntax = getattr(grammar, "syntax", None)  # a tool grammar's call syntax, for reading the calls
    return built


def _gbnf_as_lark(grammar: str) -> str:
    try:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        return gbnf_to_lark(grammar)
    except Exception as exc:  # no llguidance, or a grammar its converter cannot take
        line = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InvalidRequest(f"grammar cannot follow a reasoning block (llguidance cannot read it: {line}); "
                             "give reasoning_budget 0 to constrain the whole answer") from None
