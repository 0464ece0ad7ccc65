"""How deep a graph of rules referring to rules reaches, and how the counts along it multiply.

Two graphs are read this way: a GBNF grammar's rules (gbnf_shape records, for each rule and each
group, a rule of its own, the rules it refers to and the repetition counts around each), and a
JSON schema's subschemas with their `$ref`s (schema_reach). From either, without recursion:

- depth: the longest path of references, as a backend descending the grammar follows it
  (llguidance's compiler, llama-cpp-python's converter, llama.cpp's left-recursion check):
  each reference is a level;
- product: the largest product of two or more repetition counts nested along a path,
  ("a"{0,30}){0,30} and `r ::= "a"{0,30}` then `root ::= r{0,30}` both 900: the ways a text can
  be split among nested counts, which llama.cpp's sampler keeps a stack for each of (a count
  with none around or inside it is one way, whatever its size: 1).

Recursive rules form cycles; each cycle (a strongly connected component) is taken whole: a
path may pass each of its members once, and all of its own counts multiply. A reference to
nothing in the graph is a leaf (the parser or the schema checks report it).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass
class Reference:
    """An item of a rule that is a rule of its own (a named rule, a group, a subschema), or a
    repeated terminal (target None), with the counts it is repeated by."""
    target: str | None
    factor: int = 1  # the product of its repetition counts ({0,n}: n; *, + and ?: 1)


@dataclass
class Reach:
    depth: int = 0  # levels of references, along the longest path
    product: int = 1  # the largest product of two or more nested repetition counts (1: none nest)
    counts: int = 1  # the largest product of counts along a path, one count alone included


def nest(factor: int, inner: Reach) -> Reach:
    """`inner` repeated `factor` times: products of nested counts grow once both sides count."""
    if factor <= 1:
        return Reach(inner.depth, inner.product, inner.counts)
    nested = max(factor * inner.product if inner.product > 1 else 1, factor * inner.counts if inner.counts > 1 else 1)
    return Reach(inner.depth, nested, factor * inner.counts)


def reach(graph: dict[str, list[Reference]]) -> Reach:
    """The deepest path and the largest product over every rule of `graph`."""
    components = _components(graph)
    component_of = {rule: k for k, members in enumerate(components) for rule in members}
    found: list[Reach] = []  # per component, in the order _components returns them: callees first
    for k, members in enumerate(components):
        inside = [ref for rule in members for ref in graph[rule] if component_of.get(ref.target) == k]
        # a path passes each member of a cycle once: one level per member with a reference inside
        depth = len({rule for rule in members if any(component_of.get(ref.target) == k for ref in graph[rule])})
        cycle = prod(ref.factor for ref in inside)  # the cycle's own counts, taken as one
        best = nest(cycle, Reach(depth))
        for rule in members:
            for ref in graph[rule]:
                target = component_of.get(ref.target)
                if target == k:
                    continue
                below = found[target] if target is not None else Reach()
                path = nest(cycle, nest(ref.factor, below))
                best.depth = max(best.depth, depth + (target is not None) + below.depth)
                best.product = max(best.product, path.product)
                best.counts = max(best.counts, path.counts)
        found.append(best)
    return Reach(max((r.depth for r in found), default=0), max((r.product for r in found), default=1),
                 max((r.counts for r in found), default=1))


def _components(graph: dict[str, list[Reference]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (a chain of 10,000 rules is no
    Python recursion), each listed after every component it refers to."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            rule, next_edge = work.pop()
            if next_edge == 0:
                index[rule] = low[rule] = len(index)
                stack.append(rule)
                on_stack.add(rule)
            edges = graph.get(rule, [])
            descended = False
            for i in range(next_edge, len(edges)):
                target = edges[i].target
                if target is None or target not in graph:
                    continue
                if target not in index:
                    work.append((rule, i + 1))
                    work.append((target, 0))
                    descended = True
                    break
                if target in on_stack:
                    low[rule] = min(low[rule], index[target])
            if descended:
                continue
            if low[rule] == index[rule]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == rule:
                        break
                components.append(members)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[rule])
    return components
