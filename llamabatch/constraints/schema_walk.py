"""Every subschema of a JSON schema, visited once, without recursion and within bounds.

The schema rules (schema_closing.py, schema_checks.py) need each subschema with where it sits:
its path, the keyword that holds it, and the schema that holds it. A schema comes from a
request, so the walk is iterative (no Python recursion to exhaust) and refuses a schema nested
deeper than MAX_DEPTH subschemas or holding more than MAX_NODES of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import InvalidRequest

MAX_DEPTH = 64  # subschemas inside subschemas; real schemas stay under 20
MAX_NODES = 100_000  # a 512 KiB schema of small subschemas has about 20,000

# Keywords whose value is an object of subschemas, a list of them, or one subschema
# (draft 2020-12, with the earlier drafts' `definitions`, array `items` and `additionalItems`).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_ONES = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "unevaluatedItems",
               "contains", "propertyNames", "not", "if", "then", "else")


@dataclass
class Subschema:
    path: tuple[str | int, ...]  # keys from the root: ("properties", "age")
    node: dict
    keyword: str | None  # the keyword that holds it (None at the root)
    parent: dict | None
    depth: int


def walk(schema: dict) -> Iterator[Subschema]:
    """Each object subschema of `schema` (boolean ones are not visited), parents first. A
    caller may change a node it is given before the walk goes on: its children are read after."""
    stack = [Subschema((), schema, None, None, 0)]
    seen = 0
    while stack:
        here = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise InvalidRequest(f"json_schema has more than {MAX_NODES:,} subschemas")
        if here.depth > MAX_DEPTH:
            raise InvalidRequest(f"json_schema nests subschemas deeper than {MAX_DEPTH} levels (at {pointer(here.path)})")
        yield here
        children = list(_children(here))
        stack.extend(reversed(children))  # in document order


def _children(here: Subschema) -> Iterator[Subschema]:
    node, depth = here.node, here.depth + 1
    for keyword, value in node.items():
        if keyword in SCHEMA_MAPS and isinstance(value, dict):
            places = value.items()
        elif (keyword in SCHEMA_LISTS or keyword == "items") and isinstance(value, list):
            places = enumerate(value)
        elif keyword in SCHEMA_ONES:
            places = [(None, value)]
        else:
            continue
        for key, child in places:
            if isinstance(child, dict):
                path = here.path + ((keyword,) if key is None else (keyword, key))
                yield Subschema(path, child, keyword, node, depth)


def pointer(path: tuple[str | int, ...], limit: int = 120) -> str:
    """A path as a JSON pointer fragment (`#/properties/age`), shortened past `limit` characters."""
    text = "#" + "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def where(path: tuple[str | int, ...]) -> str:
    """`json_schema` and, below the root, where in it: the start of a one-line message."""
    return "json_schema" if not path else f"json_schema at {pointer(path)}"
