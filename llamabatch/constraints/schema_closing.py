"""Only the listed properties: a schema rewritten so that answers carry no key it never named.

JSON Schema's letter allows any property an object schema does not list, and a constrained
model uses that freedom: asked for `{"label": ...}` it writes `{"label": "negative", "text": ...`
and `max_tokens` cuts the invented key into invalid JSON. llama.cpp's converter, xgrammar's
strict mode and OpenAI's strict structured outputs all generate only the listed properties;
llguidance follows the letter and has no option for it. So every backend is given the schema
with that rule written in:

- an object schema that lists `properties` and says nothing of others (no
  `additionalProperties`, `patternProperties` or `unevaluatedProperties`) gets
  `"additionalProperties": false`;
- an array schema with `prefixItems` and no `items` gets `"items": false` (with a list `items`
  of the earlier drafts and no `additionalItems`, `"additionalItems": false`).

A schema that lists no properties (`{"type": "object"}`, what `json_object` asks for) stays
open. So does one whose keys are shared with other schemas, where closing one part would
forbid the keys of another: an `allOf` member, a schema with its own `properties` beside
`anyOf`/`oneOf`/`$ref` (and those members), a definition an `allOf` or such a `$ref` points to,
and what sits under `if`/`then`/`else`/`not`/`dependentSchemas`.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .schema_walk import Subschema, pointer, walk

OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# Keywords whose subschemas add to their parent rather than stand for a value of their own.
COMBINING = ("allOf", "if", "then", "else", "not", "dependentSchemas")
CHOICES = ("anyOf", "oneOf")


def close_schema(schema: dict) -> dict:
    """`schema` changed in place as the module says; returns it. Give it a copy of a request's
    schema (one parsed afresh from its text), never the request's own."""
    shared = _shared_definitions(schema)
    for here in walk(schema):
        if not _may_close(here, shared):
            continue
        node = here.node
        if isinstance(node.get("properties"), dict) and not any(key in node for key in OPENERS):
            node["additionalProperties"] = False
        if isinstance(node.get("prefixItems"), list) and "items" not in node and "unevaluatedItems" not in node:
            node["items"] = False
        elif isinstance(node.get("items"), list) and "additionalItems" not in node and "unevaluatedItems" not in node:
            node["additionalItems"] = False
    return schema


def _may_close(here: Subschema, shared: set[str]) -> bool:
    return not _combines(here.node) and _stands_alone(here) and pointer(here.path, limit=10**9) not in shared


def _stands_alone(here: Subschema) -> bool:
    """Not in a place whose keys add to its parent's: under `allOf`, `if`, ..., or a branch of
    an `anyOf`/`oneOf` whose parent lists keys of its own."""
    if here.keyword in COMBINING:
        return False
    return not (here.keyword in CHOICES and here.parent is not None and _combines(here.parent))


def _combines(node: dict) -> bool:
    """A schema whose own properties meet those of another schema it names."""
    has_own = "properties" in node or "prefixItems" in node or isinstance(node.get("items"), list)
    return "allOf" in node or (has_own and ("$ref" in node or any(key in node for key in CHOICES)))


def _shared_definitions(schema: dict) -> set[str]:
    """The local `$ref` targets whose keys meet another schema's: named from a place that does
    not stand alone (an `allOf` member, ...) or by a `$ref` beside other keywords."""
    shared = set()
    for here in walk(schema):
        ref = here.node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            continue
        beside = [key for key in here.node if key not in ("$ref", "$defs", "definitions") and not _annotation(key)]
        if beside or not _stands_alone(here):
            shared.add(unquote(ref))
    return shared


def _annotation(key: Any) -> bool:
    return key in ("$schema", "$id", "$comment", "title", "description", "default", "examples")
