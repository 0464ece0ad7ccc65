"""What llama.cpp's own GBNF sampler (the llama grammar backend) is not given, beyond constraints.gbnf_guard.

Its cost: llama.cpp keeps one stack per way the grammar can go on, and at every step matches
every one of them against every token of the vocabulary. A choice of n alternatives (an enum of
n strings) keeps n stacks while they share a prefix. One step of llama.cpp's grammar code over a
262,144-token vocabulary (Gemma 3's) took 0.17 s at 10 alternatives, 0.74 s at 100, 2.6 s at
500, 4.9 s at 1,000 and 15 s at 5,000 (0.6 s at 500 over 49,152 tokens, SmolLM2's): ~3 ms per
alternative per token, so a 50,000-string enum takes minutes a token. llguidance compiles the
same choice into a lexer and answers in microseconds, so past the bound the error points there.
The count is every '|' of the grammar, which bounds the stacks one choice starts.

Nested counts multiply the same way: for ("a"{0,n}){0,m}, or r{0,m} with r ::= "a"{0,n}, it keeps
a stack for each way the a's so far can be split among the copies, about n * m of them (its own
check multiplies only counts written inside one rule). So the product of the counts along any
path of rules (constraints.reference_graph) is bounded; llguidance answers the same grammars
at once. A JSON schema's `pattern` is bounded alike, in schema_expansion.

Its token references: <[id]> or <text> naming a token the sampler can never pick (outside the
vocabulary, end-of-generation, or one whose text is empty) is a position no token satisfies,
and llama.cpp aborts on accepting the token sampled there.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...constraints.gbnf_shape import measure
from ...constraints.reference_graph import reach

if TYPE_CHECKING:
    from ..vocab import Vocabulary

MAX_LLAMA_ALTERNATIVES = 500  # ~2.6 s a token on a 262,144-token vocabulary at worst
MAX_LLAMA_COUNT_PRODUCT = 400  # nested counts multiplied; the time a token grows with its square


def llama_grammar_problem(grammar: str, vocab: "Vocabulary", what: str = "grammar") -> str | None:
    """Why llama.cpp's sampler must not take this grammar (one line), or None."""
    shape = measure(grammar)
    if shape.alternatives > MAX_LLAMA_ALTERNATIVES:
        return (f"{what} has {shape.alternatives:,} alternatives ('|'); llama.cpp's grammar sampler matches each "
                f"against the whole vocabulary every token, so the llama grammar backend takes at most "
                f"{MAX_LLAMA_ALTERNATIVES:,} (--grammar-backend llguidance takes more)")
    product = reach(shape.references).product
    if product > MAX_LLAMA_COUNT_PRODUCT:
        return (f"{what} nests repetition counts whose product is {product:,}; llama.cpp's grammar sampler keeps "
                f"a stack for each way to split a text among them, so the llama grammar backend takes at most "
                f"{MAX_LLAMA_COUNT_PRODUCT:,} (--grammar-backend llguidance takes more)")
    ids = list(shape.token_ids)
    for text in shape.token_texts:
        tokens = vocab.tokenize(text, special=True)
        ids += tokens[-1:] if len(tokens) >= 1 else []  # llama.cpp refuses texts of other lengths itself
    for token in ids:
        if not 0 <= token < vocab.n_tokens:
            return f"{what}: token <[{token}]> is outside the vocabulary (0..{vocab.n_tokens - 1})"
        if vocab.is_eog(token):
            return f"{what}: token <[{token}]> ends generation, which a grammar cannot ask for as text"
        if not vocab.piece(token, special=True).strip(b"\0"):
            return f"{what}: token <[{token}]> has no text, so the grammar sampler can never pick it"
    return None
