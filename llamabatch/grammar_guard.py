"""Grammars that parse but make llama.cpp abort while sampling, refused before they get there.

llama.cpp decodes every token piece into code points ending in 0, so a grammar position that
only a NUL character (U+0000) can satisfy matches no token: every candidate is rejected, a
token is sampled anyway, and accepting it throws "Unexpected empty grammar stack after
accepting piece", which cannot cross the C API: std::terminate, the process aborts. Example:
    root ::= "\\u0000"
This scanner finds such positions in GBNF text (a NUL in a string literal, or a positive
character class that holds nothing but NUL) without building the grammar. A negated class
such as [^"\\x00-\\x1F] is fine and common (JSON strings).
"""
from __future__ import annotations

_ESCAPES = {"x": 2, "u": 4, "U": 8}
_SIMPLE = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}


def nul_only_position(grammar: str) -> str | None:
    """The piece of `grammar` that only NUL can match, or None. Unparseable text gives None:
    llama.cpp's own parser reports those."""
    i, n = 0, len(grammar)
    try:
        while i < n:
            c = grammar[i]
            if c == "#":
                while i < n and grammar[i] not in "\r\n":
                    i += 1
            elif c == '"':
                start, i = i, i + 1
                while grammar[i] != '"':
                    code, i = _char(grammar, i)
                    if code == 0:
                        return grammar[start:i + 1]
                i += 1
            elif c == "[":
                start, i = i, i + 1
                negated = grammar[i] == "^"
                if negated:
                    i += 1
                highs = []
                while grammar[i] != "]":
                    low, i = _char(grammar, i)
                    high = low
                    if grammar[i] == "-" and grammar[i + 1] != "]":
                        high, i = _char(grammar, i + 1)
                    highs.append(high)
                i += 1
                if not negated and highs and max(highs) == 0:
                    return grammar[start:i]
            else:
                i += 1
    except (IndexError, ValueError):
        return None
    return None


def _char(text: str, i: int) -> tuple[int, int]:
    """One (possibly escaped) character at i: its code point and the index after it."""
    if text[i] != "\\":
        return ord(text[i]), i + 1
    kind = text[i + 1]
    if kind in _ESCAPES:
        digits = text[i + 2:i + 2 + _ESCAPES[kind]]
        if len(digits) != _ESCAPES[kind]:
            raise ValueError("short escape")
        return int(digits, 16), i + 2 + len(digits)
    if kind in _SIMPLE:
        return _SIMPLE[kind], i + 2
    raise ValueError("unknown escape")
