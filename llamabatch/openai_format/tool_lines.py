"""Where a chat line or body meets its tools: the one call lines.py makes for every chat request.

It reads the tools and the choice (tools_request.py), puts the history's tool turns in the
template's shape (tool_turns.py), adds the tools for the template as a first pseudo-message,
and sets the call constraint (constraints/tool_grammar.py) as the request's grammar.
"""
from __future__ import annotations

from typing import Any

from ..constraints.tool_grammar import tool_grammar
from ..errors import InvalidRequest
from .tool_turns import tool_turns
from .tools_request import TOOLS_MESSAGE_ROLE, ToolRequest, parse_tools, tools_message


def chat_with_tools(source: dict[str, Any], messages: list[dict], sampling: dict[str, Any],
                    where: str = "body.") -> tuple[list[dict], ToolRequest | None]:
    """(the messages the engine renders, the ToolRequest or None); `sampling` gets the call
    grammar. `source` is the body (or the plain line, `where` "") the tool fields are read from."""
    for i, message in enumerate(messages):
        if message.get("role") == TOOLS_MESSAGE_ROLE:
            raise InvalidRequest(f"messages[{i}].role {TOOLS_MESSAGE_ROLE!r} is llamabatch's own; "
                                 "give tools in the tools field")
    request = parse_tools(source, where)
    messages = tool_turns(messages)
    if request is None or not request.calls_allowed:
        return messages, request  # tool_choice none: the tools are not shown to the model at all
    if sampling.get("json_schema") is not None or sampling.get("grammar"):
        raise InvalidRequest(f"{where}tools constrain the answer to tool calls and cannot be combined with "
                             "response_format or grammar (with tool_choice none they can)")
    sampling["grammar"] = call_grammar(request)
    return [tools_message(request), *messages], request


def call_grammar(request: ToolRequest) -> Any:
    """The constraint on a request's calls (chat bodies and /v1/responses alike)."""
    offered = [(t.name, t.parameters) for t in request.offered()]
    # a named choice asks for that call, once (as OpenAI answers it), whatever parallel_tool_calls says
    return tool_grammar(offered, request.choice, request.parallel and not request.named)
