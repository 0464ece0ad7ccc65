"""Grammars that only NUL can satisfy are refused before llama.cpp aborts on them."""
from __future__ import annotations

import pytest

from llamabatch import InvalidRequest, SamplingParams
from llamabatch.grammar_guard import nul_only_position


@pytest.mark.parametrize("grammar,found", [
    ('root ::= "\\u0000"', '"\\u0000"'),  # the grammar, as JSON decodes it
    ('root ::= "ab\\x00"', '"ab\\x00"'),
    ('root ::= "\x00"', '"\x00"'),  # a raw NUL character
    ('root ::= [\\x00]', "[\\x00]"),
    ('root ::= [\\U00000000-\\x00]', "[\\U00000000-\\x00]"),
])
def test_positions_only_nul_can_match_are_found(grammar, found):
    assert nul_only_position(grammar) == found


@pytest.mark.parametrize("grammar", [
    'root ::= "a"',
    'root ::= [^"\\\\\\x00-\\x1F]*',  # a JSON string body: NUL excluded, not required
    'root ::= [\\x00-\\x1f]',  # a range that holds more than NUL
    'root ::= "\\\\u0000"',  # an escaped backslash, then the text u0000
    'root ::= "a" # "\\u0000" in a comment',
    'root ::= "\\u00',  # unparseable: llama.cpp's parser reports it
])
def test_ordinary_grammars_pass(grammar):
    assert nul_only_position(grammar) is None


def test_sampling_params_refuse_it_with_one_line():
    with pytest.raises(InvalidRequest, match="matches only a NUL character"):
        SamplingParams(grammar='root ::= "\\u0000"').validate()
