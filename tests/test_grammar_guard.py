"""Grammars that would crash llama.cpp's grammar code are refused before it sees them."""
from __future__ import annotations

import json

import pytest

from llamabatch import InvalidRequest, SamplingParams
from llamabatch.constraints.gbnf_shape import measure
from llamabatch.constraints.gbnf_guard import (MAX_GRAMMAR_BYTES, MAX_GRAMMAR_ELEMENTS, MAX_GRAMMAR_RULES, MAX_GROUP_DEPTH,
                                               MAX_REFERENCE_DEPTH, MAX_REPETITION_COUNT, grammar_problem)
from llamabatch.constraints.reference_graph import reach
from llamabatch.llama.sampling.schema_expansion import MAX_SCHEMA_COUNT, schema_expansion_problem


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
    # surrogates are halves of UTF-16 pairs, not characters: a token's bytes never decode to one
    ('root ::= [\\uD800-\\uDFFF]', "[\\uD800-\\uDFFF]"),
    ('root ::= [\\uDC00\\uD800-\\uD8FF]', "[\\uDC00\\uD800-\\uD8FF]"),
    ('root ::= [^\\x01-\\uD7FF\\uE000-\\U0010FFFF]', "[^\\x01-\\uD7FF\\uE000-\\U0010FFFF]"),  # leaves only them
    ('root ::= "a\\uD83D\\uDE00"', '"a\\uD83D\\uDE00"'),  # a UTF-16 pair is two surrogates here
    ('root ::= "\\U0000DFFF"+', '"\\U0000DFFF"'),
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
    'root ::= [\\uD7FF-\\uE000]',  # holds U+D7FF and U+E000 around the surrogates
    'root ::= [^\\uD800-\\uDFFF]',
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


# -- depth of rule references, and repetition counts ----------------------------------------------

def chain(n: int, body: str = "r{next}") -> str:
    return "root ::= r0\n" + "".join(f"r{k} ::= {body.format(next=k + 1)}\n" for k in range(n)) + f'r{n} ::= "x"'


@pytest.mark.parametrize("grammar", [
    chain(6000),  # the issue's: r0 ::= r1, r1 ::= r2, ... (SIGSEGV in llguidance's compiler)
    chain(2000, '"x" r{next} | "y"'),  # each reference after a character
    chain(1200, '(r{next} "z")?'),  # each reference in a group (two levels a rule)
    "root ::= r0\n" + "".join(f"r{k} ::= r{k + 1} | r{(k + 2) % 2000}\n" for k in range(2000)),  # one big cycle
], ids=["chain", "after-a-character", "in-groups", "cycle"])
def test_rules_nested_past_the_depth_bound_are_refused_whatever_the_chain(grammar):
    problem = grammar_problem(grammar)
    assert problem is not None and problem.startswith("grammar nests rules") and "\n" not in problem
    assert f"at most {MAX_REFERENCE_DEPTH:,} levels" in problem


def test_rules_nested_within_the_depth_bound_pass():
    assert grammar_problem(chain(MAX_REFERENCE_DEPTH - 1)) is None
    assert reach(measure(chain(MAX_REFERENCE_DEPTH - 1)).references).depth == MAX_REFERENCE_DEPTH


def test_a_recursive_grammar_counts_its_cycle_once():
    grammar = ('root ::= value\nvalue ::= object | array | "1"\nobject ::= "{" (value ("," value)*)? "}"\n'
               'array ::= "[" value{0,5} "]"')
    assert reach(measure(grammar).references).depth < 10
    assert grammar_problem(grammar) is None


@pytest.mark.parametrize("grammar", ['root ::= "x"{100000}', 'root ::= "x"{0,20000}', 'root ::= [a-z]{10001,}',
                                     'root ::= ("ab" r){3,50000}\nr ::= "c"'])
def test_a_count_past_the_bound_is_refused_up_front(grammar):
    # llguidance took "x"{100000} and stopped the answer mid-way ("Too many items")
    problem = grammar_problem(grammar)
    assert problem is not None and problem.endswith(f"a repetition's count may be at most {MAX_REPETITION_COUNT:,}")


def test_a_count_at_the_bound_passes():
    assert grammar_problem(f'root ::= "x"{{{MAX_REPETITION_COUNT}}}') is None


@pytest.mark.parametrize("grammar,product", [
    ('root ::= ("a"{0,899}){0,899}', 899 * 899),
    ('root ::= r{0,30}\nr ::= "a"{0,30}', 900),  # through a rule: llama.cpp's own check does not multiply it
    ('root ::= (a{2} b{3}){5}\na ::= "x"{7}\nb ::= "y"', 5 * 2 * 7),  # a sequence's counts do not multiply
    ('root ::= [a-z]{0,1500}', 1),  # one count alone splits a text one way
    ('root ::= "a"* ("b"+)?', 1),
])
def test_nested_counts_multiply_along_any_path(grammar, product):
    assert reach(measure(grammar).references).product == product
