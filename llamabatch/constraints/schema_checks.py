"""Schemas no answer can satisfy, refused before any backend sees them.

llguidance finds some contradictions itself, at compile time; llama.cpp's converter finds none
and answers anyway (an integer schema with minimum 10 and maximum 5 got '10010111'), and a
`$ref` that leads only back to itself reached llguidance's parser and failed mid-answer. So
each request's schema is checked here, the same for every backend, and the first problem is
its one-line error, naming where in the schema it is.

Only what is certain is refused: bounds that leave no value (`minimum` above `maximum`, with
the exclusive forms and `multipleOf`, counted exactly; `minLength` above `maxLength`, and the
same for items, properties and `contains`), an empty `enum` or `type` list, a required
property no object may carry, more items or properties required than may appear, a `$ref`
that points to nothing or only round a cycle of `$ref`s. A keyword of one kind (a string's
`maxLength`) is checked where the schema's `type` allows only that kind or is not given.
"""
from __future__ import annotations

import json
import math
import operator
from fractions import Fraction
from typing import Any, Callable
from urllib.parse import unquote

from ..errors import InvalidRequest
from .schema_walk import Subschema, pointer, walk, where

COUNT_PAIRS = (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
               ("minContains", "maxContains", "array"), ("minProperties", "maxProperties", "object"))
# keywords that say nothing about the value: a schema of only these and `$ref` is the reference
NOT_A_CONSTRAINT = ("$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description",
                    "default", "examples")
MISSING = object()


def check_schema(schema: dict) -> None:
    """Raise InvalidRequest for the first subschema no value can satisfy."""
    refs = _RefChecker(schema)
    for here in walk(schema):
        problem = _problem(here.node) or refs.problem(here)
        if problem:
            raise InvalidRequest(f"{where(here.path)}: {problem}")


def _problem(node: dict) -> str | None:
    kinds = _kinds(node)
    if kinds == set() and isinstance(node.get("type"), list):
        return "type is an empty list, which no value has"
    if "enum" in node:
        if not isinstance(node["enum"], list):
            return f"enum must be a list of values, got {_short(node['enum'])}"
        if not node["enum"]:
            return "enum is empty, so no value can match"
    return (_number_problem(node, kinds) or _count_problem(node, kinds) or _object_problem(node, kinds)
            or _array_problem(node, kinds))


def _kinds(node: dict) -> set[str] | None:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return set(kind)
    return None  # no type (or a malformed one, the backend's to report): any kind


def _only(kinds: set[str] | None, *allowed: str) -> bool:
    return kinds is None or (bool(kinds) and kinds <= set(allowed))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- numbers --------------------------------------------------------------------------------------

def _number_problem(node: dict, kinds: set[str] | None) -> str | None:
    if not _only(kinds, "integer", "number"):
        return None
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        value = node.get(key, 0)
        if key.startswith("exclusive") and isinstance(value, bool):
            continue  # draft 4: true makes minimum / maximum exclusive
        if not (_is_number(value) and math.isfinite(value)):
            return f"{key} must be a finite number, got {_short(value)}"
    if "multipleOf" in node and node["multipleOf"] <= 0:
        return f"multipleOf must be greater than 0, got {_short(node['multipleOf'])}"
    low, high = _lower(node), _upper(node)
    if low is None or high is None:
        return None
    integer = kinds == {"integer"}
    step = Fraction(node["multipleOf"]) if "multipleOf" in node else None
    if integer:
        step = Fraction(step.numerator) if step is not None else Fraction(1)  # the integer multiples of p/q
    if step is None:
        empty = low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1]))
    else:
        first, last = math.ceil(low[0] / step), math.floor(high[0] / step)
        first += low[1] and first * step == low[0]
        last -= high[1] and last * step == high[0]
        empty = first > last
    if not empty:
        return None
    what = "integer" if integer else "number"
    if "multipleOf" in node:
        what += f" that is a multiple of {_short(node['multipleOf'])}"
    return f"no {what} is {low[2]} and {high[2]}"


def _lower(node: dict) -> tuple[Fraction, bool, str] | None:
    """The lowest bound: its value, whether it is exclusive, and its words (">= 10")."""
    return _bound(node, "minimum", "exclusiveMinimum", ">", operator.ge)


def _upper(node: dict) -> tuple[Fraction, bool, str] | None:
    return _bound(node, "maximum", "exclusiveMaximum", "<", operator.le)


def _bound(node: dict, key: str, exclusive_key: str, sign: str,
           tighter: Callable[[Fraction, Fraction], bool]) -> tuple[Fraction, bool, str] | None:
    """One side's bound: `key` (exclusive when `exclusive_key` is true, draft 4's form), or the
    number `exclusive_key` holds (draft 6 on) where that is as tight or tighter."""
    found = None
    if key in node:
        exclusive = node.get(exclusive_key) is True
        found = (Fraction(node[key]), exclusive, f"{sign if exclusive else sign + '='} {_short(node[key])}")
    value = node.get(exclusive_key)
    if _is_number(value) and (found is None or tighter(Fraction(value), found[0])):
        found = (Fraction(value), True, f"{sign} {_short(value)}")
    return found


# -- lengths and counts ---------------------------------------------------------------------------

def _count(value: Any) -> bool:
    return _is_number(value) and value >= 0 and (isinstance(value, int) or (math.isfinite(value) and value.is_integer()))


def _count_problem(node: dict, kinds: set[str] | None) -> str | None:
    for low_key, high_key, kind in COUNT_PAIRS:
        if not _only(kinds, kind):
            continue
        for key in (low_key, high_key):
            if key in node and not _count(node[key]):
                return f"{key} must be an integer >= 0, got {_short(node[key])}"
        if low_key in node and high_key in node and node[low_key] > node[high_key]:
            return f"{low_key} {_short(node[low_key])} is greater than {high_key} {_short(node[high_key])}"
    return None


def _object_problem(node: dict, kinds: set[str] | None) -> str | None:
    required = node.get("required")
    if not _only(kinds, "object") or not isinstance(required, list):
        return None
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    names = list(dict.fromkeys(name for name in required if isinstance(name, str)))
    for name in names:
        if properties.get(name, True) is False:
            return f"required property {_short(name)} has the schema false, which no value matches"
    closed = node.get("additionalProperties") is False and not node.get("patternProperties")
    if closed:
        for name in names:
            if name not in properties:
                return (f"required property {_short(name)} is not among its properties, and no other may appear "
                        f"(list it in properties, or allow others with additionalProperties)")
    most = node.get("maxProperties")
    if _count(most) and len(names) > most:
        return f"{len(names)} properties are required but maxProperties is {_short(most)}"
    least = node.get("minProperties")
    if closed and _count(least) and least > len(properties):
        return (f"minProperties is {_short(least)} but only {len(properties)} properties are listed and no other may "
                f"appear (allow others with additionalProperties)")
    return None


def _array_problem(node: dict, kinds: set[str] | None) -> str | None:
    least = node.get("minItems")
    if not _only(kinds, "array") or not _count(least):
        return None
    prefix, items = node.get("prefixItems"), node.get("items")
    if items is False:
        most = len(prefix) if isinstance(prefix, list) else 0
    elif isinstance(items, list) and node.get("additionalItems") is False:
        most = len(items)
    else:
        return None
    if least > most:
        return (f"minItems is {_short(least)} but at most {most} items may appear (the listed ones; allow more "
                f"with items)")
    return None


# -- references -----------------------------------------------------------------------------------

class _RefChecker:
    """Local `$ref`s ("#", "#/$defs/a") must point to a schema, and a chain of schemas that are
    only references must end at one that is not. Where a subschema sets its own `$id`, "#"
    means another root and the references are left to the backends."""

    def __init__(self, root: dict):
        self.root = root
        self.usable = not any("$id" in here.node for here in walk(root) if here.path)
        self.reaches_a_schema: set[str] = set()  # pointers whose chains are known to end well

    def problem(self, here: Subschema) -> str | None:
        if not self.usable or "$ref" not in here.node:
            return None
        ref = here.node["$ref"]
        if not isinstance(ref, str):
            return f"$ref must be a string, got {_short(ref)}"
        if not _local(ref):
            return None
        chain, node, ref = [pointer(here.path, limit=10**9)], here.node, ref
        while True:
            target = self.resolve(ref)
            if target is MISSING:
                return f"$ref {_short(ref)} points to nothing in the schema"
            if not _only_a_reference(node) or unquote(ref) in self.reaches_a_schema:
                break
            if unquote(ref) in chain:
                shown = " -> ".join(chain[:6] + ([" ..."] if len(chain) > 6 else []) + [unquote(ref)])
                return f"$ref cycle {shown} never reaches a schema"
            chain.append(unquote(ref))
            node = target
            if not isinstance(node, dict) or not _local(node.get("$ref")):
                break
            ref = node["$ref"]
        self.reaches_a_schema.update(chain)
        return None

    def resolve(self, ref: str) -> Any:
        fragment = unquote(ref[1:])
        node: Any = self.root
        for part in fragment.split("/")[1:] if fragment else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict):
                node = node.get(part, MISSING)
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return MISSING
            if node is MISSING:
                return MISSING
        return node


def _local(ref: Any) -> bool:
    """A reference into this schema by JSON pointer ("#", "#/..."), not by anchor or URL."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _only_a_reference(node: Any) -> bool:
    return isinstance(node, dict) and "$ref" in node and all(key in NOT_A_CONSTRAINT for key in node)
