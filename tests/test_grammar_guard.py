"""Grammars that would crash llama.cpp's grammar code are refused before it sees them."""
from __future__ import annotations

import json

import pytest

from llamabatch import InvalidRequest, SamplingParams
from llamabatch.constraints.gbnf_shape import measure
from llamabatch.constraints.gbnf_guard import (MAX_GRAMMAR_BYTES, MAX_GRAMMAR_ELEMENTS, MAX_GRAMMAR_RULES, MAX_GROUP_DEPTH,
                                      grammar_problem)
from llamabatch.llama.schema_expansion import MAX_SCHEMA_COUNT, schema_expansion_problem


@pytest.mark.parametrize("grammar,found", [
    ('root ::= "\\u0000"', '"\\u0000"'),  # NUL, as JSON decodes "\\u0000"
    ('root ::= "ab\\x00"', '"ab\\x00"'),
    ('root ::= "\x00"', '"\x00"'),  # a raw NUL character
    ('root ::= "\\U00110000"', '"\\U00110000"'),  # past the last code point
    ('root ::= [\\x00]', "[\\x00]"),
    ('root ::= [\\U00000000-\\x00]', "[\\U00000000-\\x00]"),
    ('root ::= [^\\x00-\\U0010FFFF]', "[^\\x00-\\U0010FFFF]"),  # negated: leaves nothing
    ('root ::= [^\\x01-\\U0010FFFF]', "[^\\x01-\\U0010FFFF]"),  # leaves only NUL
    ('root ::= [^\\x01-\\x7f\\u0080-\\U0010FFFF]', "[^\\x01-\\x7f\\u0080-\\U0010FFFF]"),  # ranges whose union is all
    ('root ::= [^\\u0080-\\U0010FFFF\\x01-\\x80]', "[^\\u0080-\\U0010FFFF\\x01-\\x80]"),  # overlapping, out of order
    ('root ::= [^\\x01-\\U0010FFFFa]', "[^\\x01-\\U0010FFFFa]"),
    ('root ::= [z-a]', "[z-a]"),  # a reversed range holds nothing
    ('root ::= [\\U00110000-\\UFFFFFFFF]', "[\\U00110000-\\UFFFFFFFF]"),
    ('root ::= []', "[]"),
    ('root ::= "a" x\nx ::= ("b" | [^\\x01-\\U0010FFFF])', "[^\\x01-\\U0010FFFF]"),
])
def test_positions_no_token_can_satisfy_are_found(grammar, found):
    assert measure(grammar).unmatchable == found
    assert grammar_problem(grammar).startswith(f"grammar: {found} matches no character")


@pytest.mark.parametrize("grammar", [
    'root ::= "a"',
    'root ::= [^"\\\\\\x00-\\x1F]*',  # a JSON string body: NUL excluded, not required
    'root ::= [\\x00-\\x1f]',  # a range that holds more than NUL
    'root ::= [^\\x01-\\x7e\\u0080-\\U0010FFFF]',  # leaves "\x7f"
    'root ::= [^\\x00-\\U0010FFFE]',  # leaves U+10FFFF
    'root ::= [^]',  # llama.cpp reads it as nothing at all, not as a class
    'root ::= "\\\\u0000"',  # an escaped backslash, then the text u0000
    'root ::= "a" # "\\u0000" in a comment',
    'root ::= "\\u00',  # unparseable: llama.cpp's parser reports it
    'root ::= ("a" | "b"){0,100} [0-9]+ "\\U0010FFFF"',
])
def test_ordinary_grammars_pass(grammar):
    assert grammar_problem(grammar) is None


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def test_group_nesting_is_bounded():
    assert grammar_problem(nested(MAX_GROUP_DEPTH)) is None
    # the 20,000 levels (40 KB) overflowed llama.cpp's parser stack
    assert grammar_problem(nested(20_000)) == (f"grammar nests ( ) groups 20,000 deep; "
                                               f"at most {MAX_GROUP_DEPTH:,} levels are allowed")


def test_groups_in_strings_classes_and_comments_are_not_counted():
    text = 'root ::= "((((" [(] # ((((\n'
    assert measure(text * 1).group_depth == 0


def test_rule_count_is_bounded():
    # nullable rules repeated: llama.cpp's left-recursion check recurses along the chain of
    # optional copies, once per rule, so a few lines ask for a very deep recursion
    lines = ['e0 ::= "a"?'] + [f"e{k} ::= e{k - 1}{{0,2000}}" for k in range(1, 30)] + ["root ::= e29"]
    problem = grammar_problem("\n".join(lines))
    assert problem is not None and "rules" in problem and f"at most {MAX_GRAMMAR_RULES:,}" in problem


def test_expanded_elements_are_bounded():
    # a 40 KB string written out 2,000 times: 80 million elements for llama.cpp to allocate
    problem = grammar_problem('root ::= "' + "a" * 40_000 + '"{2000}')
    assert problem is not None and f"at most {MAX_GRAMMAR_ELEMENTS:,} are allowed" in problem


@pytest.mark.parametrize("text", ['root ::= "x"{5,2}', 'root ::= ("x" [a-z]){ 3 , 1 }'])
def test_a_repetition_whose_maximum_is_below_its_minimum_is_refused(text):
    assert "has a maximum below its minimum" in grammar_problem(text)


def test_repetitions_count_as_llama_cpp_expands_them():
    shape = measure('root ::= "ab"{3,5}')
    # 3 copies of the 2 characters inline, then 2 optional rules each holding a copy (+3 elements)
    assert (shape.rules, shape.elements) == (1 + 2, 2 + 2 * 2 + 2 * (2 + 3))


def test_size_is_bounded():
    text = 'root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"'
    assert grammar_problem(text).startswith(f"grammar has {len(text):,} characters")


def test_sampling_params_refuse_them_with_one_line():
    for grammar in ('root ::= "\\u0000"', "root ::= [^\\x01-\\U0010FFFF]", nested(20_000)):
        with pytest.raises(InvalidRequest) as caught:
            SamplingParams(grammar=grammar).validate()
        assert "\n" not in str(caught.value)


def test_token_references_are_collected():
    shape = measure('root ::= <[12]> !<[3]> <|im_end|> "<[5]>"')
    assert (shape.token_ids, shape.token_texts) == ([12], ["<|im_end|>"])


# -- schemas for the llama backend's converter -------------------------------------------------

@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer"}, "maxItems": 100_000},  # nested 100,000 deep
    {"type": "array", "items": {"type": "integer"}, "maxItems": 10**9},  # a multi-GB string
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 5000}}},
    {"type": "string", "pattern": "^a{1,100000}$"},
])
def test_schema_counts_past_the_bound_are_refused_before_converting(schema):
    problem = schema_expansion_problem(json.dumps(schema))
    assert problem is not None and "--grammar-backend llguidance" in problem


def test_schema_counts_whose_copies_add_up_are_refused():
    long_name = "p" * 2000  # each copy of the item is a rule name that long
    schema = {"type": "object", "properties": {long_name: {"type": "array", "items": {"type": "integer"},
                                                           "minItems": MAX_SCHEMA_COUNT}}}
    assert "would write a grammar of more than" in schema_expansion_problem(json.dumps(schema))


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer"}, "maxItems": 100},
    {"type": "string", "maxLength": MAX_SCHEMA_COUNT, "pattern": "^[a-z]{2,8}$"},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 64},
                                               "minItems": 1, "maxItems": 10}}},
])
def test_ordinary_schemas_pass(schema):
    assert schema_expansion_problem(json.dumps(schema)) is None
