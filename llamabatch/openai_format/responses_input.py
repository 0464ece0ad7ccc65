"""A /v1/responses `input` read two ways at once: as the chat turns the model continues, and as
the input items `GET /v1/responses/{id}/input_items` lists (OpenAI's shapes, each with an id).

    "text"                                  one user message
    {"type": "message", "role", "content"}  text content (a string or input_text/output_text parts)
    {"type": "function_call", "call_id", "name", "arguments"}
                                            an earlier answer's call: joins the assistant turn before it
    {"type": "function_call_output", "call_id", "output"}
                                            the call's result: a `tool` turn answering it
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text"}], "summary"}
                                            an earlier answer's reasoning: the `reasoning_content`
                                            of the assistant turn after it (thinking templates
                                            read it there; the others leave it out)

Images, files, computer calls and every other type are refused naming it. A
function_call_output's call is looked for when the chain's turns are known (call_ids_check).
Pure: no I/O.
"""
from __future__ import annotations

import json
import secrets
from typing import Any

from ..errors import InvalidRequest
from .fields import json_kind

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")  # output_text: an earlier assistant turn sent back as input
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def read_input(value: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the chat turns, the input items with ids) of a body's `input`."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    elif not isinstance(value, list) or not value:
        raise InvalidRequest(f"body.input must be a string or a non-empty list of items, got {json_kind(value)}")
    turns: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    reasoning: str | None = None  # reasoning items' text, for the assistant turn after them
    reasoning_at = 0  # where the first of them is
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object, got {json_kind(item)}")
        kind = item.get("type", "message")
        if kind == "reasoning":
            text, listed = _reasoning(item, where)
            reasoning, reasoning_at = (text, i) if reasoning is None else (f"{reasoning}\n{text}", reasoning_at)
            items.append(listed)
            continue
        if kind == "message":
            turn, listed = _message(item, where)
            turns.append(turn)
        elif kind == "function_call":
            call, listed = _function_call(item, where)
            if turns and turns[-1]["role"] == "assistant" and reasoning is None:  # one answer's calls: one turn
                turns[-1].setdefault("tool_calls", []).append(call)
            else:
                turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            turn, listed = _call_output(item, where)
            turns.append(turn)
        else:
            raise InvalidRequest(f"{where} has type {short_json(kind)}, which this server does not take "
                                 f"({', '.join(ITEM_TYPES)} items, with text only)")
        if reasoning is not None:
            if turns[-1]["role"] != "assistant":
                raise _unanswered(reasoning_at)
            turns[-1]["reasoning_content"] = reasoning
        reasoning = None
        items.append(listed)
    if not turns:
        raise InvalidRequest("body.input holds no message or call to continue (reasoning items alone)")
    if reasoning is not None:
        raise _unanswered(reasoning_at)
    return turns, items


def _unanswered(index: int) -> InvalidRequest:
    """A reasoning item goes back just before its answer's items (OpenAI refuses one without them too)."""
    return InvalidRequest(f"input[{index}] is a reasoning item with no assistant message or function_call right "
                          "after it: send an answer's reasoning just before that answer's items")


def call_ids_check(history: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
    """Each function_call_output answers a function_call made before it: in this input or in the
    chain's earlier responses. InvalidRequest names the item."""
    known = {call["id"] for turn in history for call in turn.get("tool_calls", [])}
    for i, item in enumerate(items):
        if item["type"] == "function_call":
            known.add(item["call_id"])
        elif item["type"] == "function_call_output" and item["call_id"] not in known:
            raise InvalidRequest(f"input[{i}].call_id {json.dumps(item['call_id'])} matches no function_call "
                                 "before it (in input or in the previous responses' output)")


def _message(item: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {', '.join(ROLES)}, got {short_json(role)}")
    texts = _texts(item.get("content"), where)
    part = "output_text" if role == "assistant" else "input_text"
    content = [{"type": part, "text": t, **({"annotations": []} if role == "assistant" else {})} for t in texts]
    listed = {"id": _id(item, "msg_"), "type": "message", "role": role, "content": content, "status": "completed"}
    return {"role": role, "content": "\n".join(texts)}, listed  # separate blocks of text: a line between them


def _texts(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of parts, got {json_kind(value)}")
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            shown = short_json(kind) if isinstance(part, dict) else json_kind(part)
            raise InvalidRequest(f"{where}.content[{i}] has type {shown}, which this server does not take "
                                 f"(text parts only: {', '.join(TEXT_PARTS)})")
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}.content[{i}].text must be a string")
        texts.append(part["text"])
    return texts


def _reasoning(item: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """An earlier answer's reasoning item: (its reasoning_text parts joined, the item as listed)."""
    content = item.get("content")
    content = [] if content is None else content  # OpenAI's own items may hold encrypted_content alone
    if not isinstance(content, list) or not all(_is_part(p, "reasoning_text") for p in content):
        raise InvalidRequest(f"{where}.content must be a list of reasoning_text parts with a string text")
    summary = item.get("summary", [])
    if not isinstance(summary, list):
        raise InvalidRequest(f"{where}.summary must be a list, got {json_kind(summary)}")
    bad = next((i for i, p in enumerate(summary) if not _is_part(p, "summary_text")), None)
    if bad is not None:  # listed by input_items as given: OpenAI's shape only
        raise InvalidRequest(f'{where}.summary[{bad}] must be a summary_text part ({{"type": "summary_text", '
                             f'"text": "..."}}), got {short_json(summary[bad])}')
    if not isinstance(item.get("encrypted_content", ""), (str, type(None))):
        raise InvalidRequest(f"{where}.encrypted_content must be a string, got {json_kind(item['encrypted_content'])}")
    listed = {"id": _id(item, "rs_"), "type": "reasoning", "summary": summary,
              "content": [{"type": "reasoning_text", "text": p["text"]} for p in content], "status": "completed"}
    return "".join(p["text"] for p in content), listed


def _is_part(part: Any, kind: str) -> bool:
    return isinstance(part, dict) and part.get("type") == kind and isinstance(part.get("text"), str)


def _function_call(item: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    call_id, name, arguments = _string(item, "call_id", where), _string(item, "name", where), item.get("arguments")
    if not isinstance(arguments, str):
        raise InvalidRequest(f"{where}.arguments must be a JSON string, got {json_kind(arguments)}")
    listed = {"id": _id(item, "fc_"), "type": "function_call", "call_id": call_id, "name": name,
              "arguments": arguments, "status": "completed"}
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}, listed


def _call_output(item: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    call_id, output = _string(item, "call_id", where), item.get("output")
    if isinstance(output, list):  # parts: text ones only, as a message's
        output = "\n".join(_texts(output, f"{where}.output"))
    if not isinstance(output, str):
        raise InvalidRequest(f"{where}.output must be a string or a list of input_text parts, got {json_kind(output)}")
    listed = {"id": _id(item, "fco_"), "type": "function_call_output", "call_id": call_id, "output": output,
              "status": "completed"}
    return {"role": "tool", "tool_call_id": call_id, "content": output}, listed


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.{name} must be a non-empty string, got {short_json(value)}")
    return value


def _id(item: dict[str, Any], prefix: str) -> str:
    given = item.get("id")
    return given if isinstance(given, str) and given else prefix + secrets.token_hex(24)


def short_json(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
