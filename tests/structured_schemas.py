"""Twenty JSON schemas and extraction prompts for structured output: flat and nested
objects, arrays, enum, const, anyOf, $ref/$defs, required, additionalProperties false, string
length and pattern, number ranges. Every string, array and number is bounded (a number's
fraction digits by multipleOf), so an answer always ends within max_tokens and can be validated
whole. Used by tests/test_structured_model.py
and benchmarks/structured.py."""
from __future__ import annotations

from typing import Any

NAME = {"type": "string", "maxLength": 24}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}


def obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False, **extra}


SCHEMAS: dict[str, dict[str, Any]] = {
    "person": obj({"name": NAME, "age": AGE, "city": {"type": "string", "maxLength": 20}}),
    "sentiment": obj({"label": {"enum": ["positive", "negative", "neutral"]}}),
    "yes_no": obj({"answer": {"type": "boolean"}}),
    "price": obj({"item": NAME, "price": {"type": "number", "minimum": 0, "maximum": 10000, "multipleOf": 0.25},
                  "currency": {"enum": ["USD", "EUR", "GBP"]}}),
    "date": obj({"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}),
    "tags": obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3}}),
    "nested_address": obj({"name": NAME, "address": obj({"street": {"type": "string", "maxLength": 30},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})}),
    "const_version": obj({"version": {"const": 1}, "ok": {"type": "boolean"}}),
    "any_of": obj({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "string", "maxLength": 10}]}}),
    "refs": {"$defs": {"person": obj({"name": NAME, "age": AGE})},
             **obj({"author": {"$ref": "#/$defs/person"}, "editor": {"$ref": "#/$defs/person"}})},
    "optional_fields": obj({"title": {"type": "string", "maxLength": 30}, "subtitle": {"type": "string", "maxLength": 30}},
                           required=["title"]),
    "list_of_people": obj({"people": {"type": "array", "items": obj({"name": NAME, "age": AGE}), "maxItems": 3}}),
    "email": obj({"email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$"}}),
    "rating": obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": {"type": "string", "maxLength": 40}}),
    "colour": obj({"colour": {"enum": ["red", "green", "blue", "yellow"]}, "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}),
    # multipleOf bounds the fraction digits too (a range alone does not: Gemma wrote 200 of them);
    # 0.25, exact in binary: jsonschema checks multipleOf in floating point (43.4526 / 0.0001 is not whole)
    "coordinates": obj({"lat": {"type": "number", "minimum": -90, "maximum": 90, "multipleOf": 0.25},
                        "lon": {"type": "number", "minimum": -180, "maximum": 180, "multipleOf": 0.25}}),
    "short_code": obj({"code": {"type": "string", "minLength": 3, "maxLength": 3}}),
    "matrix": obj({"rows": {"type": "array", "maxItems": 2,
                            "items": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}),
    # a tree two levels deep through $refs: a recursive node has no depth bound, and a greedy
    # model nests until max_tokens (the recursive $ref is tested to compile on its own)
    "tree": {"$defs": {"leaf": obj({"label": {"type": "string", "maxLength": 8}}),
                       "branch": obj({"label": {"type": "string", "maxLength": 8},
                                      "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/leaf"}}})},
             **obj({"label": {"type": "string", "maxLength": 8},
                    "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/branch"}}})},
    "order": obj({"id": {"type": "integer", "minimum": 1, "maximum": 99999},
                  "status": {"enum": ["new", "paid", "shipped"]},
                  "lines": {"type": "array", "maxItems": 2,
                            "items": obj({"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                                          "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
}

DOCUMENTS = [
    "Ada Lovelace, 36, lives in London and wrote about the Analytical Engine on 1843-07-10.",
    "Bob Smith is 41. He bought a bicycle for 250 EUR in Paris; he rated the shop 4 stars.",
    "Chen Li (29) moved to Shanghai. Contact: chen@mail.com. Favourite colour: green.",
    "Order 1042 was paid: two of item AB123 and one of CD456, shipped to 12 Elm Street, 90210.",
    "The review said: great food, kind staff, will come back. Location 48.85, 2.35.",
    "Maria, aged 52, from Madrid, edits the magazine that Tom, 33, writes for.",
    "Version 1 of the report is fine. Tags: finance, quarterly. Code: XYZ.",
    "The tree: root has children left and right; left has child leaf.",
    "A blue car, colour code #1a2b3c, costs 9000 USD.",
    "Rows of numbers: 1 2, then 3 4.",
]


def prompt_for(schema_name: str, document: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You extract data from documents as JSON."},
            {"role": "user", "content": f"Document: {document}\nGive the {schema_name.replace('_', ' ')} as JSON."}]


def lines(n: int) -> list[tuple[str, list[dict[str, str]]]]:
    """`n` (schema name, chat messages) pairs, cycling through every schema and document."""
    names = list(SCHEMAS)
    return [(names[i % len(names)], prompt_for(names[i % len(names)], DOCUMENTS[i % len(DOCUMENTS)])) for i in range(n)]
