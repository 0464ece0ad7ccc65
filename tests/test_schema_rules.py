"""JSON schemas before any backend sees them: closed to their listed properties, and refused
with one line where no answer could satisfy them (llamabatch/schema_*.py)."""
from __future__ import annotations

import json

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.errors import InvalidRequest
from llamabatch.constraints.schema_closing import close_schema
from llamabatch.constraints.schema_prepare import prepared_schema_text
from llamabatch.constraints.schema_reach import MAX_OPTIONAL_PROPERTIES, MAX_RESOLVED_DEPTH
from llamabatch.constraints.schema_walk import MAX_DEPTH

from fake_runner import FakeRunner
from structured_schemas import SCHEMAS


def closed(schema: dict) -> dict:
    return json.loads(prepared_schema_text(schema))


def refusal(schema) -> str:
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams(json_schema=schema).validate()
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    return message


# -- only the listed properties -------------------------------------------------------------------

def test_an_object_that_lists_properties_gets_only_them():
    schema = {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
              "required": ["label"]}
    assert closed(schema) == {**schema, "additionalProperties": False}
    assert "additionalProperties" not in schema  # the request's own schema is left as given


def test_nested_objects_array_items_branches_and_definitions_are_closed_too():
    person = {"type": "object", "properties": {"name": {"type": "string"}}}
    schema = {"type": "object", "properties": {
        "owner": person, "people": {"type": "array", "items": person},
        "either": {"anyOf": [person, {"type": "integer"}]}, "who": {"$ref": "#/$defs/person"}},
        "$defs": {"person": person}}
    out = closed(schema)
    assert out["additionalProperties"] is False
    for place in (out["properties"]["owner"], out["properties"]["people"]["items"],
                  out["properties"]["either"]["anyOf"][0], out["$defs"]["person"]):
        assert place["additionalProperties"] is False, place
    assert out["properties"]["who"] == {"$ref": "#/$defs/person"}


def test_a_tuple_gets_only_its_listed_items():
    assert closed({"type": "array", "prefixItems": [{"type": "integer"}]})["items"] is False
    assert closed({"type": "array", "items": [{"type": "integer"}]})["additionalItems"] is False
    assert "additionalItems" not in closed({"type": "array", "items": {"type": "integer"}})


def test_what_a_schema_opens_or_does_not_list_stays_open():
    for schema in ({"type": "object"},  # json_object's schema: any object
                   {"type": "object", "required": ["a"]},
                   {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
                   {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
                   {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}},
                   {"type": "array", "prefixItems": [{}], "items": {"type": "string"}}):
        assert closed(schema) == schema


def test_schemas_whose_keys_meet_other_schemas_stay_open():
    base = {"type": "object", "properties": {"id": {"type": "integer"}}}
    extended = {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"name": {"type": "string"}}}],
                "properties": {"note": {"type": "string"}}, "$defs": {"base": base}}
    out = closed(extended)
    assert "additionalProperties" not in out and "additionalProperties" not in out["allOf"][1]
    assert "additionalProperties" not in out["$defs"]["base"]  # an allOf member names it
    tagged = {"type": "object", "properties": {"kind": {"type": "string"}},
              "oneOf": [{"properties": {"kind": {"const": "a"}, "a": {}}}, {"properties": {"kind": {"const": "b"}}}]}
    out = closed(tagged)
    assert "additionalProperties" not in out and all("additionalProperties" not in b for b in out["oneOf"])


def test_the_twenty_schemas_without_additional_properties_close_to_the_written_ones():
    for name, schema in SCHEMAS.items():
        text = json.dumps(schema).replace(', "additionalProperties": false', "")
        assert "additionalProperties" not in text
        assert closed(json.loads(text)) == schema, name


def test_close_schema_walks_without_recursion_and_refuses_past_the_depth_bound():
    deep = {"type": "string"}
    for _ in range(MAX_DEPTH + 5):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(InvalidRequest, match=f"deeper than {MAX_DEPTH} levels"):
        close_schema(deep)


# -- schemas no answer can satisfy ----------------------------------------------------------------

UNSATISFIABLE = {
    "integer range": ({"type": "integer", "minimum": 10, "maximum": 5}, "no integer is >= 10 and <= 5"),
    "exclusive bounds": ({"type": "number", "exclusiveMinimum": 3, "maximum": 3}, "no number is > 3 and <= 3"),
    "draft-4 exclusive": ({"type": "number", "minimum": 3, "exclusiveMinimum": True, "maximum": 3}, "> 3 and <= 3"),
    "no integer between": ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, "no integer is >= 1.2 and <= 1.8"),
    "no multiple": ({"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5}, "multiple of 5"),
    "nested range": ({"type": "object", "properties": {"age": {"type": "integer", "minimum": 120, "maximum": 0}}},
                     "json_schema at #/properties/age: no integer is >= 120 and <= 0"),
    "string lengths": ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 is greater than maxLength 2"),
    "item counts": ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 is greater than maxItems 1"),
    "property counts": ({"type": "object", "minProperties": 2, "maxProperties": 1},
                        "minProperties 2 is greater than maxProperties 1"),
    "forbidden required": ({"type": "object", "properties": {"a": {}}, "required": ["a", "b"],
                            "additionalProperties": False}, 'required property "b" is not among its properties'),
    "unlisted required": ({"type": "object", "properties": {"a": {}}, "required": ["b"]},
                          'required property "b" is not among its properties'),
    "required false": ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "schema false"),
    "too many required": ({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"],
                           "maxProperties": 1}, "2 properties are required but maxProperties is 1"),
    "short tuple": ({"type": "array", "prefixItems": [{}], "minItems": 2}, "minItems is 2 but at most 1 items"),
    "empty enum": ({"enum": []}, "enum is empty"),
    "empty type list": ({"type": []}, "type is an empty list"),
    "schema false": (False, "json_schema is false"),
    "bad multipleOf": ({"type": "number", "multipleOf": 0}, "multipleOf must be greater than 0"),
    "not a number": ({"type": "integer", "minimum": "1"}, 'minimum must be a finite number, got "1"'),
    "negative length": ({"type": "string", "maxLength": -1}, "maxLength must be an integer >= 0"),
    "missing ref": ({"$ref": "#/$defs/nope"}, "json_schema: $ref \"#/$defs/nope\" points to nothing"),
    "not JSON text": ('{"type": ', "json_schema is not valid JSON"),
    "not an object": ("[1, 2]", "json_schema must be a JSON object (a schema), got an array"),
}


@pytest.mark.parametrize("case", sorted(UNSATISFIABLE))
def test_a_schema_no_answer_can_satisfy_is_refused_in_one_line_naming_where(case):
    schema, expected = UNSATISFIABLE[case]
    assert expected in refusal(schema)


def test_satisfiable_edges_are_accepted():
    for schema in ({"type": "integer", "minimum": 5, "maximum": 5},
                   {"type": "number", "exclusiveMinimum": 1.5, "exclusiveMaximum": 1.75},
                   {"type": "integer", "minimum": 1, "maximum": 10, "multipleOf": 2.5},  # 5 and 10
                   {"type": ["integer", "string"], "minimum": 10, "maximum": 5},  # strings still fit
                   {"type": "string", "minLength": 3, "maxLength": 3},
                   {"type": "array", "prefixItems": [{}, {}], "minItems": 2},
                   {"type": "object", "properties": {"a": {}}, "required": ["a"], "maxProperties": 1},
                   {"type": "object", "required": ["a"]},
                   {"$ref": "http://example.com/schema"},  # not ours to resolve: the backend says
                   {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
                    "$ref": "#/$defs/node"}):
        SamplingParams(json_schema=schema).validate()
    for schema in SCHEMAS.values():
        SamplingParams(json_schema=schema).validate()


def test_a_ref_cycle_that_never_reaches_a_schema_is_refused():
    assert refusal({"$ref": "#"}) == "json_schema: $ref cycle # -> # never reaches a schema"
    two = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert "$ref cycle # -> #/$defs/a -> #/$defs/b -> #/$defs/a never reaches a schema" in refusal(two)
    inner = {"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}}
    assert refusal(inner).startswith("json_schema at #/properties/x: $ref cycle")


def test_grammar_with_json_schema_says_to_give_one():
    with pytest.raises(InvalidRequest) as caught:
        SamplingParams(grammar='root ::= "a"', json_schema={}).validate()
    assert str(caught.value) == "give either grammar or json_schema, not both"


def test_a_refused_schema_is_refused_from_the_cache_with_the_same_message():
    schema = {"type": "integer", "minimum": 10, "maximum": 5}
    assert refusal(schema) == refusal(dict(schema))


def test_the_engine_answers_such_a_schema_with_its_error_at_submit_and_runs_the_others():
    runner = FakeRunner(n_slots=2, n_batch=64)
    config = EngineConfig(n_parallel=2, n_batch=64, chunk_size=16, max_queue=0)
    with Engine(config, runner=runner, default_params=SamplingParams(temperature=0, max_tokens=4)) as engine:
        bad = engine.submit("x", SamplingParams(max_tokens=4, json_schema={"$ref": "#"})).result(10)
        good = engine.submit("x", SamplingParams(max_tokens=4, temperature=0)).result(10)
    assert bad.finish_reason == "error" and bad.error_code == "invalid_request"
    assert bad.error == "json_schema: $ref cycle # -> # never reaches a schema"
    assert good.ok


# -- depth once $refs are followed, and optional properties ---------------------------------------

def definitions_chain(n: int, make) -> dict:
    """d0 .. d<n-1>, each made by `make` from a reference to the next; d<n> an integer."""
    defs = {f"d{k}": make({"$ref": f"#/$defs/d{k + 1}"}) for k in range(n)}
    return {"$ref": "#/$defs/d0", "$defs": {**defs, f"d{n}": {"type": "integer"}}}


@pytest.mark.parametrize("make", [
    lambda ref: ref,  # the issue's $ref chain (SIGSEGV in llguidance's compiler)
    lambda ref: {"type": "array", "items": ref},  # nested arrays
    lambda ref: {"type": "object", "properties": {"a": ref}, "required": ["a"]},
    lambda ref: {"anyOf": [ref, {"type": "null"}]},
    lambda ref: {"allOf": [ref]},
    lambda ref: {"type": "array", "prefixItems": [ref]},
])
def test_a_ref_chain_past_the_depth_bound_is_refused_whatever_it_passes_through(make):
    message = refusal(definitions_chain(3000, make))
    assert message.startswith("json_schema nests subschemas") and f"at most {MAX_RESOLVED_DEPTH:,} levels" in message


def test_a_ref_chain_through_definitions_and_a_pointer_with_escapes_is_followed():
    defs = {f"a/{k}": {"type": "array", "items": {"$ref": f"#/definitions/a~1{k + 1}"}} for k in range(300)}
    schema = {"$ref": "#/definitions/a~10", "definitions": {**defs, "a/300": {"type": "integer"}}}
    assert "once its $refs are followed" in refusal(schema)


def test_a_ref_chain_within_the_depth_bound_passes_and_recursion_counts_its_cycle_once():
    closed(definitions_chain(MAX_RESOLVED_DEPTH // 2 - 2, lambda ref: {"type": "array", "items": ref}))
    tree = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}}}
    closed(tree)


def test_too_many_optional_properties_are_refused_naming_the_limit():
    properties = {f"p{k}": {"type": "integer"} for k in range(11_000)}
    message = refusal({"type": "object", "properties": properties})
    assert message == (f"json_schema: 11,000 of its properties are optional; an object may have at most "
                       f"{MAX_OPTIONAL_PROPERTIES:,} optional properties (list the others in required)")
    nested = {"type": "object", "properties": {"inner": {"type": "object", "properties": properties, "required": ["p0"]}}}
    assert refusal(nested).startswith("json_schema at #/properties/inner: 10,999 of its properties are optional")


def test_many_required_properties_pass():
    properties = {f"p{k}": {"type": "integer"} for k in range(11_000)}
    closed({"type": "object", "properties": properties, "required": list(properties)})
    closed({"type": "object", "properties": dict(list(properties.items())[:MAX_OPTIONAL_PROPERTIES])})
