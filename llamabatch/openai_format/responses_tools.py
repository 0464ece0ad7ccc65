"""Function tools in /v1/responses, in the Responses API's own shapes, over the chat tools'
parts (tools_request.py, tool_lines.py, tool_calls.py):

    tools        [{"type": "function", "name", "description", "parameters", "strict"}]  (flat)
    tool_choice  none | auto | required | {"type": "function", "name": ...}
    output       {"type": "function_call", "id", "call_id", "name", "arguments", "status"} items

A tool of another type (web_search, file_search, computer, mcp, ...) is refused naming it. The
calls are constrained and read out of the answer exactly as a chat request's are. Pure: no I/O.
"""
from __future__ import annotations

import json
import secrets
from typing import Any

from ..constraints.tool_syntax import syntax_named
from ..errors import InvalidRequest
from .fields import json_kind
from .tool_calls import openai_call, split_tool_calls
from .tools_request import CHOICES, Tool, ToolRequest, function_tool, tool_array, unique_tools

TOOL_FIELDS = ("type", "name", "description", "parameters", "strict")


def new_function_call_id() -> str:
    return "fc_" + secrets.token_hex(24)


def parse_responses_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The body's `tools`, `tool_choice` and `parallel_tool_calls`, checked; None when it asks
    for no calls (no tools, or tool_choice none or auto without tools)."""
    tools = _tools(body.get("tools"))
    choice, named = _choice(body.get("tool_choice"))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest(f"body.parallel_tool_calls must be true or false, got {json_kind(parallel)}")
    if not tools:
        if choice == "required":
            shown = json.dumps(body.get("tool_choice"))
            raise InvalidRequest(f"body.tool_choice {shown} needs body.tools, and the request lists none")
        return None
    names = {t.name for t in tools}
    if named is not None and named not in names:
        raise InvalidRequest(f"body.tool_choice names {named!r}, which is not among the listed tools "
                             f"({', '.join(sorted(names))})")
    return ToolRequest(tools, choice or "auto", named, parallel is not False)


def _tools(value: Any) -> list[Tool]:
    tools = []
    for i, item in enumerate(tool_array(value, "body.tools")):
        here = f"body.tools[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{here} must be an object, got {json_kind(item)}")
        if item.get("type") != "function":
            raise InvalidRequest(f"{here} has type {json.dumps(item.get('type'))}, which this server does not "
                                 'serve (function tools only: "type": "function")')
        unknown = sorted(set(item) - set(TOOL_FIELDS))
        if unknown:
            raise InvalidRequest(f"{here} has an unknown field {unknown[0]!r}")
        tools.append(function_tool({k: v for k, v in item.items() if k != "type"}, here))
    return unique_tools(tools, "body.tools")


def _choice(value: Any) -> tuple[str | None, str | None]:
    """(none / auto / required, or None when unset; the named function or None)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        if value not in CHOICES:
            raise InvalidRequest(f'body.tool_choice must be none, auto, required or {{"type": "function", '
                                 f'"name": ...}}, got {json.dumps(value)}')
        return value, None
    if not isinstance(value, dict):
        raise InvalidRequest(f"body.tool_choice must be a string or an object, got {json_kind(value)}")
    if value.get("type") != "function":
        raise InvalidRequest(f"body.tool_choice has type {json.dumps(value.get('type'))}, which this server "
                             "does not serve (function tools only)")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest('body.tool_choice must name a function: {"type": "function", "name": ...}')
    return "required", name


def tools_echo(tools: ToolRequest | None, tool_choice: Any) -> dict[str, Any]:
    """The response's `tools`, `tool_choice` and `parallel_tool_calls`, as the request set them.
    `strict` reads true when unset: a call's arguments always follow the tool's schema here."""
    if tools is None:
        choice = tool_choice if tool_choice in CHOICES else "auto"
        return {"tools": [], "tool_choice": choice, "parallel_tool_calls": True}
    listed = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
               "strict": t.strict is not False} for t in tools.tools]
    choice = {"type": "function", "name": tools.named} if tools.named else tools.choice
    return {"tools": listed, "tool_choice": choice, "parallel_tool_calls": tools.parallel}


def function_call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    """A call read out of the answer ({"name", "arguments"}) as a `function_call` output item."""
    chat = openai_call(call["name"], call["arguments"])  # the chat call's id and arguments text
    return {"id": new_function_call_id(), "type": "function_call", "status": status,
            "arguments": chat["function"]["arguments"], "call_id": chat["id"], "name": call["name"]}


def answer_parts(text: str, tools: ToolRequest | None, syntax: str | None = None
                 ) -> tuple[str | None, list[dict[str, Any]]]:
    """(the message's text or None when there is only calls, the calls) of a whole answer;
    `syntax`: the call syntax the engine constrained (the Result's tool_syntax)."""
    if tools is None or not tools.calls_allowed:
        return text, []
    content, calls = split_tool_calls(text, syntax_named(syntax))
    return content, [function_call_item(c) for c in calls]
