"""What a GBNF grammar's text will make llama.cpp's parser build, measured without building it.

One pass over the text, following llama.cpp's lexical rules (llama-grammar.cpp: strings,
character classes, token references, groups, repetitions, comments), records what its parser
and sampler are known to choke on: positions no token can satisfy, how deep its recursive
descent goes, how many rules and elements the repetitions expand to, and the token references a
vocabulary must check. The grammar is not validated: text that llama.cpp's parser would refuse
is measured as far as it goes (the parser reports the rest).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .reference_graph import Reference

MAX_CODE_POINT = 0x10FFFF  # what a token's text decodes to; NUL ends a piece and is never matched
# UTF-16 halves, not characters: no UTF-8 text decodes to one (a token's bytes that try become U+FFFD)
SURROGATES = (0xD800, 0xDFFF)
# llama.cpp's MAX_REPETITION_THRESHOLD: a larger {m,n} maximum is read as unbounded, {m,}
LLAMA_REPETITION_THRESHOLD = 2000
_ESCAPES = {"x": 2, "u": 4, "U": 8}
_SIMPLE = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}


class _Unparseable(Exception):
    """The text stops following GBNF here; llama.cpp's parser refuses it at the same point."""


@dataclass
class GrammarShape:
    unmatchable: str | None = None  # the first piece of text no token can ever satisfy
    reversed_repetition: str | None = None  # a {m,n} with n < m
    group_depth: int = 0  # the deepest nesting of ( ) groups
    rules: int = 0  # rules llama.cpp creates: named, one per group, and per repetition
    elements: int = 0  # grammar elements after repetitions are expanded (8 bytes each in C)
    alternatives: int = 0  # the `|` choices, all rules together
    token_ids: list[int] = field(default_factory=list)  # <[id]> references
    token_texts: list[str] = field(default_factory=list)  # <text> references
    largest_count: int = 0  # the largest count of a {m,n}, {m,} or {n}
    # what each rule holds (named rules by name, each group as "(" and its number): reference_graph
    references: dict[str, list[Reference]] = field(default_factory=dict)


def measure(grammar: str) -> GrammarShape:
    shape = GrammarShape()
    try:
        _Walk(grammar, shape).run()
    except (_Unparseable, IndexError, ValueError):
        pass  # the parser stops here too, with its own message
    return shape


class _Walk:
    def __init__(self, text: str, shape: GrammarShape):
        self.text = text
        self.i = 0
        self.shape = shape
        self.last = 0  # elements of the item a repetition would apply to (0: none)
        self.last_reference: Reference | None = None  # that item, where it is a reference
        self.open_groups: list[int] = []  # the element count where each open group began
        self.rule = ""  # the rule, or the innermost open group, whose items are being read
        self.enclosing: list[tuple[str, Reference]] = []  # per open group: its rule's name, its reference

    def _refer(self, target: str | None) -> Reference:
        reference = Reference(target)
        self.shape.references.setdefault(self.rule, []).append(reference)
        return reference

    def run(self) -> None:
        text, n = self.text, len(self.text)
        while self.i < n:
            c = text[self.i]
            if c == "#":
                while self.i < n and text[self.i] not in "\r\n":
                    self.i += 1
            elif c == '"':
                self._string()
            elif c == "[":
                self._class()
            elif c == "<" or (c == "!" and text[self.i + 1:self.i + 2] == "<"):
                self._token()
            elif c == "(":
                self.i += 1
                self.shape.rules += 1
                self.open_groups.append(self.shape.elements)
                self.shape.group_depth = max(self.shape.group_depth, len(self.open_groups))
                self.last = 0
                group = f"({self.shape.rules}"
                self.enclosing.append((self.rule, self._refer(group)))
                self.rule = group
            elif c == ")":
                self.i += 1
                if not self.open_groups:
                    raise _Unparseable
                self.open_groups.pop()
                self.rule, reference = self.enclosing.pop()
                self._item(1, reference)  # the group becomes a reference to its rule
            elif c == "|":
                self.i += 1
                self.shape.alternatives += 1
                self.last = 0
            elif c in "*+?":
                self.i += 1
                self._repeat(1 if c == "+" else 0, 1 if c == "?" else None)
            elif c == "{":
                self._braces()
            elif c == ".":
                self.i += 1
                self._item(1)
            elif _is_word_char(c):
                self._name()
            else:
                self.i += 1  # spaces, newlines; anything else the parser refuses itself

    def _item(self, elements: int, reference: Reference | None = None) -> None:
        self.shape.elements += elements
        self.last = elements
        self.last_reference = reference

    def _name(self) -> None:
        text, start = self.text, self.i
        while self.i < len(text) and _is_word_char(text[self.i]):
            self.i += 1
        after = self._skip_space(self.i)
        if text.startswith("::=", after):  # a rule's definition
            self.shape.rules += 1
            self.rule, self.enclosing = text[start:self.i], []
            self.shape.references.setdefault(self.rule, [])
            self.i = after + 3
            self.last = 0
        elif self.i > start:
            self._item(1, self._refer(text[start:self.i]))

    def _string(self) -> None:
        start = self.i
        self.i += 1
        count, matchable = 0, True
        while self.text[self.i] != '"':
            code = self._char()
            count += 1
            matchable = matchable and _is_character(code)
        self.i += 1
        if not matchable and self.shape.unmatchable is None:
            self.shape.unmatchable = self.text[start:self.i]
        self._item(count)
        if count == 0:
            self.last = 0  # llama.cpp: an empty string is nothing to repeat

    def _class(self) -> None:
        start = self.i
        self.i += 1
        negated = self.text[self.i] == "^"
        self.i += negated
        ranges: list[tuple[int, int]] = []
        while self.text[self.i] != "]":
            low = high = self._char()
            if self.text[self.i] == "-" and self.text[self.i + 1] != "]":
                self.i += 1
                high = self._char()
            ranges.append((low, high))
        self.i += 1
        if self.shape.unmatchable is None and not _matches_some(ranges, negated):
            self.shape.unmatchable = self.text[start:self.i]
        # one element per character, one more per range's upper end
        self._item(sum(1 if low == high else 2 for low, high in ranges) or 0)
        if not ranges:
            self.last = 0

    def _token(self) -> None:
        negated = self.text[self.i] == "!"
        self.i += 1 + negated
        end = self.text.index(">", self.i)
        body = self.text[self.i:end]
        self.i = end + 1
        if not negated:
            if body.startswith("[") and body.endswith("]") and body[1:-1].isdigit():
                self.shape.token_ids.append(int(body[1:-1]))
            else:
                self.shape.token_texts.append(f"<{body}>")
        self._item(1)

    def _braces(self) -> None:
        """{m}, {m,} or {m,n}, with spaces and comments where llama.cpp's parser allows them."""
        start = self.i
        at_least, self.i = self._int(self._skip_space(self.i + 1))
        at_most: int | None = at_least
        self.i = self._skip_space(self.i)
        if self.text[self.i] == ",":
            self.i = self._skip_space(self.i + 1)
            at_most = None
            if self.text[self.i].isdigit():
                at_most, self.i = self._int(self.i)
                self.i = self._skip_space(self.i)
        if self.text[self.i] != "}":
            raise _Unparseable
        self.i += 1
        if at_most is not None and at_most < at_least:
            # llama.cpp counts n - m optional copies in an unsigned integer: 2**64 - (m - n) of them
            if self.shape.reversed_repetition is None:
                self.shape.reversed_repetition = self.text[start:self.i]
            return
        self.shape.largest_count = max(self.shape.largest_count, at_least, at_most or 0)
        self._repeat(at_least, at_most)

    def _int(self, i: int) -> tuple[int, int]:
        end = i
        while end < len(self.text) and self.text[end] in "0123456789":
            end += 1
        if end == i:
            raise _Unparseable
        return int(self.text[i:end]), end

    def _skip_space(self, i: int) -> int:
        """Past spaces, newlines and comments from i (inside a group llama.cpp allows newlines)."""
        text = self.text
        while i < len(text) and text[i] in " \t\r\n#":
            if text[i] == "#":
                while i < len(text) and text[i] not in "\r\n":
                    i += 1
            else:
                i += 1
        return i

    def _repeat(self, at_least: int, at_most: int | None) -> None:
        """As llama.cpp rewrites S{m,n}: m copies of S, then a chain of n-m optional rules, each
        holding a copy of S (one rule for an unbounded maximum)."""
        item = self.last
        reference = self.last_reference or (self._refer(None) if item else None)
        count = at_least if at_most is None else at_most
        if reference is not None:
            reference.factor *= max(count, 1)
        self.last_reference = reference
        if at_most is not None and at_most > LLAMA_REPETITION_THRESHOLD:
            at_most = None
        optional = 1 if at_most is None else at_most - at_least
        self.shape.rules += optional
        self.shape.elements += item * max(at_least - 1, 0) + optional * (item + 3)
        self.last = item * at_least + (1 if optional else 0)

    def _char(self) -> int:
        """One (possibly escaped) character at i: its code point; moves past it."""
        text, i = self.text, self.i
        if text[i] != "\\":
            self.i = i + 1
            return ord(text[i])
        kind = text[i + 1]
        if kind in _ESCAPES:
            digits = text[i + 2:i + 2 + _ESCAPES[kind]]
            if len(digits) != _ESCAPES[kind] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise _Unparseable
            self.i = i + 2 + len(digits)
            return int(digits, 16)
        if kind in _SIMPLE:
            self.i = i + 2
            return _SIMPLE[kind]
        raise _Unparseable


def _is_word_char(c: str) -> bool:
    """llama.cpp's rule-name characters: ASCII letters, digits and '-'."""
    return c.isascii() and (c.isalnum() or c == "-")


def _is_character(code: int) -> bool:
    """A code point some token's text can decode to: not NUL, not a surrogate, not past U+10FFFF."""
    return 0 < code <= MAX_CODE_POINT and not SURROGATES[0] <= code <= SURROGATES[1]


def _matches_some(ranges: list[tuple[int, int]], negated: bool) -> bool:
    """Whether a class of these inclusive ranges holds a character (_is_character)."""
    spans = sorted((max(low, 1), min(high, MAX_CODE_POINT)) for low, high in ranges)
    spans = [(low, high) for low, high in spans if low <= high]
    if not negated:
        # a span holds a character unless it lies wholly within the surrogates
        return any(not (SURROGATES[0] <= low and high <= SURROGATES[1]) for low, high in spans)
    spans = sorted(spans + [SURROGATES])  # surrogates are never left over for a negated class to hold
    reach = 0  # every code point in 1..reach is in some range
    for low, high in spans:
        if low > reach + 1:
            return True  # reach + 1 is in no range: the negated class holds it
        reach = max(reach, high)
    return reach < MAX_CODE_POINT
