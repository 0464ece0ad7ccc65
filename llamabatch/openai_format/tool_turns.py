"""Tool turns in a chat history, as OpenAI clients replay them, made ready for a chat template.

- an assistant message with `tool_calls` (content null or text): each call's `arguments` JSON
  string becomes the object Hugging Face templates expect (`tool_call.arguments | tojson`);
- a `tool` message answers one of those calls by `tool_call_id`; it also gets the called
  function's `name`, which some templates print;
- the legacy forms: an assistant `function_call` becomes a one-call `tool_calls`, a `function`
  message (`name`, content) a `tool` message answering it.

InvalidRequest names the field (`messages[3].tool_call_id`); the line parser makes it the
line's error record.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from .fields import json_kind

TOOL_ROLES = ("tool", "function")


def has_tool_turns(messages: list[dict]) -> bool:
    return any(m.get("role") in TOOL_ROLES or m.get("tool_calls") is not None or m.get("function_call") is not None
               for m in messages)


def tool_turns(messages: list[dict], where: str = "messages") -> list[dict]:
    """`messages` with their tool turns in the shape templates read; the others unchanged."""
    if not has_tool_turns(messages):
        return messages
    out: list[dict] = []
    calls: dict[str, str] = {}  # call id -> function name, of the calls made so far
    legacy_ids: dict[str, str] = {}  # function name -> the id given to its latest legacy call
    for i, message in enumerate(messages):
        here = f"{where}[{i}]"
        role = message.get("role")
        if role == "assistant" and (message.get("tool_calls") is not None or message.get("function_call") is not None):
            out.append(_assistant(message, here, calls, legacy_ids, len(out)))
        elif role == "tool":
            out.append(_tool_result(message, here, calls))
        elif role == "function":
            name = message.get("name")
            if not isinstance(name, str) or name not in legacy_ids:
                raise InvalidRequest(f"{here}.name must name a function an earlier assistant message called "
                                     f"(function_call), got {json.dumps(name)}")
            out.append({"role": "tool", "tool_call_id": legacy_ids[name], "name": name,
                        "content": message.get("content") if message.get("content") is not None else ""})
        else:
            out.append(message)
    return out


def _assistant(message: dict, here: str, calls: dict[str, str], legacy_ids: dict[str, str], position: int) -> dict:
    if message.get("tool_calls") is not None and message.get("function_call") is not None:
        raise InvalidRequest(f"{here} gives tool_calls and the older function_call; give one")
    if message.get("function_call") is not None:
        call_id = f"call_{position}"
        function = _function(message["function_call"], f"{here}.function_call")
        legacy_ids[function["name"]] = call_id
        raw = [{"id": call_id, "type": "function", "function": message["function_call"]}]
        where = f"{here}.function_call"
    else:
        raw = message["tool_calls"]
        where = f"{here}.tool_calls"
        if not isinstance(raw, list):
            raise InvalidRequest(f"{where} must be an array of calls, got {json_kind(raw)}")
    checked = []
    for j, call in enumerate(raw):
        at = where if "function_call" in where else f"{where}[{j}]"
        if not isinstance(call, dict):
            raise InvalidRequest(f"{at} must be an object with id, type and function, got {json_kind(call)}")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest(f"{at}.id must be a non-empty string, got {json.dumps(call_id)}")
        if call.get("type", "function") != "function":
            raise InvalidRequest(f'{at}.type must be "function", got {json.dumps(call.get("type"))}')
        function = _function(call.get("function"), f"{at}.function" if "function_call" not in at else at)
        calls[call_id] = function["name"]
        checked.append({"id": call_id, "type": "function", "function": function})
    content = message.get("content")
    return {**{k: v for k, v in message.items() if k != "function_call"},
            "content": content if content is not None else "", "tool_calls": checked}


def _function(value: Any, at: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{at} must be an object with name and arguments, got {json_kind(value)}")
    name, arguments = value.get("name"), value.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{at}.name must be a non-empty string, got {json.dumps(name)}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # kept as the text the model wrote: templates print it as a string
    elif not isinstance(arguments, dict):
        raise InvalidRequest(f"{at}.arguments must be a JSON string, got {json_kind(arguments)}")
    return {"name": name, "arguments": arguments}


def _tool_result(message: dict, here: str, calls: dict[str, str]) -> dict:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"{here}.tool_call_id must be the id of an earlier tool call, got {json.dumps(call_id)}")
    if call_id not in calls:
        raise InvalidRequest(f"{here}.tool_call_id {json.dumps(call_id)} matches no tool call of an earlier "
                             "assistant message")
    content = message.get("content")
    return {**message, "content": content if content is not None else "", "name": calls[call_id]}
