"""How counted repetitions nest in a JSON schema's regular expression (`pattern`).

`^(a{0,30}){0,30}$` asks for up to 30 runs of up to 30 a's: a text of a's can be split among
them in many ways, and llama.cpp's grammar sampler, given the converted grammar, keeps a stack
for each split it can still be in: the counts multiply. This reads the pattern as the
converters do (groups, classes, escapes, quantifiers) and returns the largest product of two
or more counts nested in one another ({n}, {m,n}, {m,}: the larger number); *, + and ? count 1
(their rules recur instead of being written out), and so does a count nothing nests with.
"""
from __future__ import annotations

import re

from .reference_graph import Reach, nest

_BRACES = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def nested_count_product(pattern: str) -> int:
    """The largest product of nested repetition counts in `pattern` (1 where none nest)."""
    levels: list[Reach] = [Reach()]  # per open group: the most its items so far multiply
    last = Reach()  # the item a quantifier would apply to
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "(":
            levels.append(Reach())
            i += 1
            last = Reach()
            continue
        if c == "\\":
            i += 2
            last = Reach()
        elif c == "[":
            i = _class_end(pattern, i)
            last = Reach()
        elif c == ")" and len(levels) > 1:
            last = levels.pop()
            i += 1
        elif c == "{" and (match := _BRACES.match(pattern, i)):
            least, most = match.groups()
            last = nest(int(most or least or 0), last)
            i = match.end()
        else:
            i += 1
            if c not in "*+?|":
                last = Reach()
        top = levels[-1]
        levels[-1] = Reach(0, max(top.product, last.product), max(top.counts, last.counts))
    return max(level.product for level in levels)


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class that opens at i (`]` first in it is a member)."""
    i += 1
    if pattern[i:i + 1] == "^":
        i += 1
    if pattern[i:i + 1] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1
