"""`chat --tools FILE`: the chat offers the model the tools of an OpenAI-style JSON file (an array
of tools, or {"tools": [...]}), with tool_choice auto: each reply may hold calls, masked valid
as in every front end (docs/tools.md). The chat runs no tool; it names each call the reply made
(a notice), and the person answers with the result as the next message.
"""
from __future__ import annotations

import json
from typing import Any

from ..constraints.tool_grammar import tool_grammar
from ..constraints.tool_syntax import ToolSyntax
from ..errors import InvalidRequest
from ..files.whole_file import UnreadableFile, read_text
from ..openai_format import ToolRequest, arguments_text, parse_tools, split_tool_calls, tools_message


def read_tools_file(path: str) -> ToolRequest:
    """The tools of FILE, checked as a request's `tools` are; InvalidRequest names what is wrong."""
    try:
        data = json.loads(read_text(path, "tools file"))
    except UnreadableFile as exc:
        raise InvalidRequest(f"cannot read tools file {path}: {exc.why}") from None
    except ValueError as exc:
        raise InvalidRequest(f"tools file {path} is not JSON: {exc}") from None
    tools = data.get("tools") if isinstance(data, dict) else data
    try:
        request = parse_tools({"tools": tools}, f"{path}: ")
    except InvalidRequest as exc:
        raise InvalidRequest(str(exc)) from None
    if request is None or not request.tools:
        raise InvalidRequest(f"tools file {path} lists no tools")
    return request


def tools_grammar(request: ToolRequest, syntax: ToolSyntax) -> str | None:
    """The call grammar in the template's syntax (the chat renders its own prompt, so the engine
    does not rebuild it)."""
    return tool_grammar([(t.name, t.parameters) for t in request.tools], request.choice, request.parallel, syntax)


class TemplateWithTools:
    """The engine's chat template, rendering every conversation with the tools in front (the
    pseudo-message models/tool_prompt.py takes out), so the prompt builder needs no change."""

    def __init__(self, template: Any, request: ToolRequest):
        self._template = template
        self._tools = tools_message(request)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self._template.render([self._tools, *messages], add_generation_prompt)

    def __getattr__(self, name: str) -> Any:  # name, stop, source: the template's own
        return getattr(self._template, name)


def call_notices(text: str, syntax: ToolSyntax) -> list[str]:
    """One line per call the reply made: `tool call: NAME {arguments}`."""
    _content, calls = split_tool_calls(text, syntax)
    return [f"tool call: {c['name']} {arguments_text(c['arguments'])}" for c in calls]
