"""What the llama grammar backend refuses beyond the guard: a cost past its bound, and token
references its sampler could never pick (llama.cpp aborts on accepting the token sampled there)."""
from __future__ import annotations

import json

import pytest

from llamabatch.llama.sampling.llama_grammar_limits import MAX_LLAMA_ALTERNATIVES, MAX_LLAMA_COUNT_PRODUCT, llama_grammar_problem
from llamabatch.llama.sampling.schema_expansion import schema_expansion_problem


class FakeVocab:
    """The four things llama_grammar_problem asks of a vocabulary: 100 tokens, 99 ends generation,
    7 has no text, <x> is token 5."""
    n_tokens = 100

    def tokenize(self, text, *, special):
        return [5] if text == "<x>" else [99] if text == "<eos>" else [1, 2]

    def is_eog(self, token):
        return token == 99

    def piece(self, token, special):
        return b"" if token == 7 else b"t"


def enum_grammar(n: int) -> str:
    return "root ::= " + " | ".join(json.dumps(f'"v{i}"') for i in range(n))


def test_an_enum_past_the_bound_is_refused_and_points_to_llguidance():
    problem = llama_grammar_problem(enum_grammar(50_000), FakeVocab())
    assert problem.startswith("grammar has 49,999 alternatives")
    assert "--grammar-backend llguidance" in problem and "\n" not in problem


def test_an_enum_within_the_bound_passes():
    assert llama_grammar_problem(enum_grammar(MAX_LLAMA_ALTERNATIVES + 1), FakeVocab()) is None


@pytest.mark.parametrize("grammar,says", [
    ("root ::= <[100]>", "outside the vocabulary"),
    ("root ::= <[4294967295]>", "outside the vocabulary"),
    ("root ::= <[99]>", "ends generation"),
    ('root ::= "a" <eos>', "ends generation"),
    ("root ::= <[7]>", "has no text"),
])
def test_tokens_the_sampler_can_never_pick_are_refused(grammar, says):
    assert says in llama_grammar_problem(grammar, FakeVocab())


@pytest.mark.parametrize("grammar", ["root ::= <[5]> !<[99]>", "root ::= <x>", 'root ::= "<[100]>"'])
def test_tokens_it_can_pick_pass(grammar):
    assert llama_grammar_problem(grammar, FakeVocab()) is None


@pytest.mark.parametrize("grammar", ['root ::= r{0,899}\nr ::= "a"{0,899}', 'root ::= ("a"{0,21} "b"?){0,20}'])
def test_nested_counts_past_the_product_bound_are_refused(grammar):
    # r{0,899} over "a"{0,899}: every token kept llama.cpp's sampler for minutes
    problem = llama_grammar_problem(grammar, FakeVocab())
    assert problem is not None and "nests repetition counts whose product is" in problem and "\n" not in problem


@pytest.mark.parametrize("grammar", ['root ::= r{0,20}\nr ::= "a"{0,20}', 'root ::= [a-z]{0,1999}'])
def test_counts_within_the_product_bound_pass(grammar):
    assert llama_grammar_problem(grammar, FakeVocab()) is None


@pytest.mark.parametrize("pattern", ["^(a{0,899}){0,899}$", "^((ab){0,30}c){1,30}$", "^(?:(x{2}){50}){5}$"])
def test_a_pattern_whose_nested_counts_multiply_past_the_bound_is_refused(pattern):
    # the pattern passed the per-count bound, then never ended on the llama backend
    problem = schema_expansion_problem(json.dumps({"type": "string", "pattern": pattern}))
    assert problem is not None and f"takes at most {MAX_LLAMA_COUNT_PRODUCT:,}" in problem


@pytest.mark.parametrize("pattern", ["^(a{0,20}){0,20}$", "^(\\d{3}-){2}\\d{4}$", "^[a-z]{0,800}$", "^[{(]{3}(x)*{2}$"])
def test_a_pattern_within_the_product_bound_passes(pattern):
    assert schema_expansion_problem(json.dumps({"type": "string", "pattern": pattern})) is None
