"""A chat request's tools, as OpenAI's Chat Completions API sends them: `tools`, `tool_choice`,
`parallel_tool_calls`, and the legacy `functions` / `function_call` mapped onto them.

Pure functions: each raises InvalidRequest naming the field (`body.tools[1].function.name`), which
the line parser turns into that line's error record (a 400 online). What the parse gives is a
ToolRequest: the tools as the chat template gets them (Hugging Face's shape) and the choice the
call constraint is built from (constraints/tool_grammar.py). Tool turns in the history are read by
tool_turns.py beside it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..constraints.schema_prepare import prepared_schema_text
from ..errors import InvalidRequest
from .fields import json_kind

# OpenAI's rule for a function's name (the API refuses any other).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")
TOOL_BODY_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
# A function without `parameters` takes none (OpenAI's reading): an empty object.
NO_PARAMETERS = {"type": "object", "properties": {}}
MAX_TOOLS = 128  # OpenAI's own limit on a request's tools


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict  # the JSON schema as given (the constraint closes it, as for json_schema)
    strict: bool | None = None

    def for_template(self) -> dict:
        """The tool as Hugging Face's chat templates read it: {"type": "function", "function": {...}}."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass
class ToolRequest:
    """What a request asks of tools. `choice` is none, auto or required; `named` the one tool a
    named choice forces (choice is then "required"). `legacy`: asked with `functions`, answered
    with `message.function_call` as OpenAI answers those."""

    tools: list[Tool] = field(default_factory=list)
    choice: str = "auto"
    named: str | None = None
    parallel: bool = True
    legacy: bool = False

    @property
    def calls_allowed(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def offered(self) -> list[Tool]:
        """The tools a call may name: the named one alone, else all of them."""
        return [t for t in self.tools if t.name == self.named] if self.named else list(self.tools)

    def names(self) -> set[str]:
        return {t.name for t in self.tools}


def has_tool_fields(body: dict[str, Any]) -> bool:
    return any(body.get(key) is not None for key in TOOL_BODY_FIELDS)


def parse_tools(body: dict[str, Any], where: str = "body.") -> ToolRequest | None:
    """The request's tools and choice from a chat body (or a plain line, `where` ""), or None
    when it names none. InvalidRequest names the first bad field."""
    if not has_tool_fields(body):
        return None
    tools_value, functions_value = body.get("tools"), body.get("functions")
    if tools_value is not None and functions_value is not None:
        raise InvalidRequest(f"give {where}tools or the older {where}functions, not both")
    if body.get("tool_choice") is not None and body.get("function_call") is not None:
        raise InvalidRequest(f"give {where}tool_choice or the older {where}function_call, not both")
    legacy = functions_value is not None or body.get("function_call") is not None
    if legacy:
        tools = _functions(functions_value, f"{where}functions")
        choice, named = _choice(body.get("function_call"), f"{where}function_call", legacy=True)
    else:
        tools = _tools(tools_value, f"{where}tools")
        choice, named = _choice(body.get("tool_choice"), f"{where}tool_choice", legacy=False)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest(f"{where}parallel_tool_calls must be true or false, got {json_kind(parallel)}")
    request = ToolRequest(tools, choice or ("auto" if tools else "none"), named,
                          parallel if parallel is not None else not legacy, legacy)
    field_name = f"{where}function_call" if legacy else f"{where}tool_choice"
    if request.choice in ("auto", "required") and not tools and (choice or named):
        raise InvalidRequest(f"{field_name} {json.dumps(body.get('function_call' if legacy else 'tool_choice'))} "
                             f"needs {where}{'functions' if legacy else 'tools'}, and the request lists none")
    if named and named not in request.names():
        listed = ", ".join(sorted(request.names())) or "none"
        raise InvalidRequest(f"{field_name} names {named!r}, which is not among the listed tools ({listed})")
    return request


def tool_array(value: Any, where: str) -> list:
    """A request's `tools` as a list ([] when absent): InvalidRequest for anything but an array
    of at most MAX_TOOLS (Chat Completions' and Responses' alike)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{where} must be an array of tools, got {json_kind(value)}")
    if len(value) > MAX_TOOLS:
        raise InvalidRequest(f"{where} has {len(value)} tools; at most {MAX_TOOLS} are allowed")
    return value


def _tools(value: Any, where: str) -> list[Tool]:
    tools: list[Tool] = []
    for i, item in enumerate(tool_array(value, where)):
        here = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{here} must be an object, got {json_kind(item)}")
        if item.get("type") != "function":
            raise InvalidRequest(f'{here}.type must be "function", got {json.dumps(item.get("type"))}'
                                 if "type" in item else f'{here}.type is missing (it must be "function")')
        unknown = sorted(set(item) - {"type", "function"})
        if unknown:
            raise InvalidRequest(f"{here} has an unknown field {unknown[0]!r}")
        tools.append(function_tool(item.get("function"), f"{here}.function"))
    return unique_tools(tools, where)


def _functions(value: Any, where: str) -> list[Tool]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{where} must be an array of functions, got {json_kind(value)}")
    if len(value) > MAX_TOOLS:
        raise InvalidRequest(f"{where} has {len(value)} functions; at most {MAX_TOOLS} are allowed")
    return unique_tools([function_tool(item, f"{where}[{i}]") for i, item in enumerate(value)], where)


def function_tool(value: Any, here: str) -> Tool:
    """One function ({name, description, parameters, strict}) checked; /v1/responses' flat tools too."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{here} must be an object with name, description and parameters, got {json_kind(value)}")
    unknown = sorted(set(value) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise InvalidRequest(f"{here} has an unknown field {unknown[0]!r}")
    name = value.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidRequest(f"{here}.name must be 1 to 64 letters, digits, _ or -, got {json.dumps(name)}")
    description = value.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"{here}.description must be a string, got {json_kind(description)}")
    strict = value.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(f"{here}.strict must be true or false, got {json_kind(strict)}")
    parameters = value.get("parameters")
    if parameters is None:
        parameters = dict(NO_PARAMETERS)
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"{here}.parameters must be a JSON schema object, got {json_kind(parameters)}")
    if parameters.get("type", "object") != "object":
        raise InvalidRequest(f'{here}.parameters must describe an object ("type": "object"), '
                             f"got type {json.dumps(parameters.get('type'))}")
    try:
        prepared_schema_text(parameters)  # the json_schema guard: what it refuses, a tool may not hold either
    except InvalidRequest as exc:
        raise InvalidRequest(f"{here}.parameters is not a usable schema: {_after_subject(str(exc))}") from None
    return Tool(name, description, parameters, strict)


def unique_tools(tools: list[Tool], where: str) -> list[Tool]:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise InvalidRequest(f"{where}[{i}] repeats the name {tool.name!r}: each tool needs its own name")
        seen.add(tool.name)
    return tools


def _choice(value: Any, where: str, legacy: bool) -> tuple[str | None, str | None]:
    """(none / auto / required, or None when unset; the named tool or None)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        allowed = ("none", "auto") if legacy else CHOICES
        if value not in allowed:
            shape = '{"name": ...}' if legacy else '{"type": "function", "function": {"name": ...}}'
            raise InvalidRequest(f"{where} must be {', '.join(allowed)} or {shape}, got {json.dumps(value)}")
        return value, None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be a string or an object, got {json_kind(value)}")
    if legacy:
        name = value.get("name")
    else:
        if value.get("type") != "function":
            raise InvalidRequest(f'{where}.type must be "function", got {json.dumps(value.get("type"))} '
                                 "(allowed_tools and custom tools are not supported)")
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where} must name a function: "
                             + ('{"name": ...}' if legacy else '{"type": "function", "function": {"name": ...}}'))
    return "required", name


def _after_subject(message: str) -> str:
    """A json_schema guard message without its leading 'json_schema' (the field is named before it)."""
    for subject in ("json_schema: ", "json_schema "):
        if message.startswith(subject):
            return message[len(subject):]
    return message


# The tools reach the chat template inside the messages, as a first pseudo-message of this role
# (the engine renders messages alone); models/tool_prompt.py takes it out and hands the tools to
# the template. A request's own messages may not use the role (tool_lines.py refuses it).
TOOLS_MESSAGE_ROLE = "llamabatch.tools"


def tools_message(request: ToolRequest) -> dict:
    return {"role": TOOLS_MESSAGE_ROLE, "content": "", "tools": [t.for_template() for t in request.tools]}
