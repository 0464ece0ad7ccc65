"""JSON schemas within what both backends compile without crashing or failing mid-answer.

Two shapes that schema_checks' walk lets through did harm (figures: docs/structured-output.md):

- depth once `$ref`s are followed: a chain of definitions (`{"$ref": "#/$defs/d1"}`, ...,
  arrays or objects whose items or properties refer to the next) is shallow as written, but
  llguidance compiles it by recursion on the submitting thread and overflows its stack
  (SIGSEGV), and llama-cpp-python's converter recurses in Python past its limit. The depth is
  counted over subschemas and their `$ref`s (reference_graph.reach: each cycle of recursive
  definitions counted whole, a path may pass each of its members once);
- optional properties of one object: llguidance keeps an item per property that may come
  next, and past its parser's items a step the answer stops mid-way ("Current row has 2003
  items"; many thousands more panic its compiler); llama-cpp-python's converter nests a rule per
  optional property and runs past Python's recursion limit. Required ones cost neither.
"""
from __future__ import annotations

from urllib.parse import unquote

from .reference_graph import Reference, reach
from .schema_walk import pointer, walk, where

MAX_RESOLVED_DEPTH = 256  # subschemas in subschemas, $refs followed; the converter fails from ~480
MAX_OPTIONAL_PROPERTIES = 400  # per object; llguidance stops answering from 501


def schema_reach_problem(schema: dict) -> str | None:
    """The first way `schema` (parsed, closed) goes past these bounds, as one line, or None."""
    graph: dict[str, list[Reference]] = {}
    name_of: dict[int, str] = {}  # id of each subschema's dict -> its pointer
    for here in walk(schema):
        node = here.node
        name = name_of[id(node)] = pointer(here.path, limit=10**9)
        graph[name] = []
        if here.parent is not None:
            graph[name_of[id(here.parent)]].append(Reference(name))
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            graph[name].append(Reference(unquote(ref)))  # a pointer to no subschema is a leaf
        properties = node.get("properties")
        if isinstance(properties, dict):
            required = node.get("required") if isinstance(node.get("required"), list) else []
            optional = len(properties.keys() - {key for key in required if isinstance(key, str)})
            if optional > MAX_OPTIONAL_PROPERTIES:
                return (f"{where(here.path)}: {optional:,} of its properties are optional; an object may have at most "
                        f"{MAX_OPTIONAL_PROPERTIES:,} optional properties (list the others in required)")
    depth = reach(graph).depth
    if depth > MAX_RESOLVED_DEPTH:
        return (f"json_schema nests subschemas {depth:,} deep once its $refs are followed; at most "
                f"{MAX_RESOLVED_DEPTH:,} levels are allowed")
    return None
