"""What the llama grammar backend refuses beyond the guard: a cost past its bound, and token
references its sampler could never pick (llama.cpp aborts on accepting the token sampled there)."""
from __future__ import annotations

import json

import pytest

from llamabatch.llama.llama_grammar_limits import MAX_LLAMA_ALTERNATIVES, llama_grammar_problem


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
