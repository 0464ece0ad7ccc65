"""How much GBNF text llama-cpp-python's JSON-schema converter would write, bounded before it runs.

The converter (llama_cpp.llama_grammar.SchemaConverter) writes repetition counts out in full:
minItems n repeats the item's rule name n times, maxItems n nests n - min optional groups
("(item ("," item (...)?)?)?"), and a pattern's {n} repeats its literal n times. A schema of 80
bytes can so ask for a grammar of gigabytes (maxItems 10**9: MemoryError after minutes) or for
100,000 nested groups (a stack overflow in llama.cpp's parser). The converted text is checked
again by constraints.gbnf_guard; this walk refuses what would be too costly even to convert.
A pattern's nested counts are written as nested rules, which llama.cpp's sampler multiplies
(llama_grammar_limits): their product is bounded as a grammar's is.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ...constraints.gbnf_guard import MAX_GRAMMAR_BYTES, MAX_GROUP_DEPTH
from ...constraints.pattern_counts import nested_count_product
from .llama_grammar_limits import MAX_LLAMA_COUNT_PRODUCT

# every count a schema may ask for: maxItems - minItems nested groups must stay under the
# group depth constraints.gbnf_guard allows (the schema's own nesting adds a few levels)
MAX_SCHEMA_COUNT = MAX_GROUP_DEPTH - 100
COUNT_KEYS = ("minItems", "maxItems", "minLength", "maxLength")
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def schema_expansion_problem(schema_text: str) -> str | None:
    """Why converting this schema for llama.cpp would cost too much (one line), or None."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return None  # the converter says what is wrong with it
    written = 0
    stack: list[tuple[Any, str]] = [(schema, "json_schema")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        counts = [(key, node[key]) for key in COUNT_KEYS if _is_count(node.get(key))]
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            counts += [("pattern's {n}", int(n)) for match in _QUANTIFIER.finditer(pattern) for n in match.groups() if n]
        if isinstance(pattern, str) and (product := nested_count_product(pattern)) > MAX_LLAMA_COUNT_PRODUCT:
            return (f"{where}: pattern nests repetition counts whose product is {product:,}; the llama grammar backend "
                    f"takes at most {MAX_LLAMA_COUNT_PRODUCT:,} (--grammar-backend llguidance takes more)")
        for key, count in counts:
            if count > MAX_SCHEMA_COUNT:
                return (f"{where}: {key} {count:,} is more than the {MAX_SCHEMA_COUNT:,} the llama grammar backend "
                        "can write out (--grammar-backend llguidance takes it)")
            # each counted copy is a rule name (as long as the path to it) or the pattern's text
            written += count * (len(where) + len(pattern if isinstance(pattern, str) else "") + 16)
        if written > MAX_GRAMMAR_BYTES:
            return (f"json_schema's repetitions would write a grammar of more than {MAX_GRAMMAR_BYTES:,} characters "
                    "for the llama grammar backend (--grammar-backend llguidance takes it)")
        stack.extend((value, f"{where}.{key}") for key, value in node.items() if isinstance(value, (dict, list)))
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
