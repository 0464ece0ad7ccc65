"""How many bytes of text can hold a given number of tokens, asked before tokenizing.

llama.cpp tokenizes a long run of spaces in about quadratic time (640k of them took 3.6 s), so
one 16 MB cell would stall every other row of a run. Under SPM and byte-level BPE each
byte of the text lies in exactly one token's piece, so a text longer than `tokens x the
vocabulary's longest piece` bytes has more than `tokens` tokens and need not be tokenized to
know it. Runners that cannot bound it (WPM and UGM normalize whitespace away) say None.
"""
from __future__ import annotations

from typing import Any

# Tokens past the cut kept when only a prefix is tokenized (embeddings with truncate): the
# merges near the cut can differ from the whole text's, never this far before it.
CUT_MARGIN_TOKENS = 64


def bytes_for(runner: Any, tokens: int) -> int | None:
    """The most bytes a text of `tokens` tokens can have on `runner`'s vocabulary, or None."""
    longest = runner.longest_token_bytes()
    return None if longest is None else longest * tokens


def too_long(runner: Any, text: str, tokens: int) -> int | None:
    """The text's size in bytes when it surely has more than `tokens` tokens, else None.
    Texts of fewer characters than `tokens` are never encoded to ask."""
    if len(text) <= tokens:
        return None
    limit = bytes_for(runner, tokens)
    if limit is None:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > limit else None


def prefix_to_tokenize(runner: Any, text: str, tokens: int) -> str:
    """`text`, or where it is far longer than `tokens` tokens, the prefix whose tokens begin
    as the whole text's do: for keeping the first `tokens` (truncation) without tokenizing
    the rest."""
    limit = bytes_for(runner, tokens + CUT_MARGIN_TOKENS)
    if limit is None or len(text) <= limit:
        return text
    return text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")
