"""Tool calls from the library: the same request fields, checks, template hand-off and call
constraint as `run` and `serve` (openai_format/tool_lines.py), around `Engine.submit`.

    from llamabatch import Engine, SamplingParams
    from llamabatch.openai_format import with_tools, tool_message

    messages, params, tools = with_tools(messages, [weather_tool], tool_choice="required",
                                         params=SamplingParams(temperature=0))
    result = engine.submit(messages, params).result()
    message, finish_reason = tool_message(result, tools)   # OpenAI's assistant message

`with_tools` gives the messages with the tools for the chat template (a first pseudo-message the
template hand-off takes out) and the params with the call grammar; `tool_message` reads the
calls out of the answer (`message["tool_calls"]`, content None when there are only calls).
docs/tools.md says what each tool_choice guarantees.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import InvalidRequest
from ..params import SamplingParams
from ..results import Result
from .fields import check_messages
from .reasoning import with_reasoning
from .tool_calls import chat_message
from .tool_lines import chat_with_tools
from .tools_request import ToolRequest


def with_tools(messages: list[dict], tools: list[dict] | None, tool_choice: Any = None, *,
               parallel_tool_calls: bool | None = None, params: SamplingParams | None = None
               ) -> tuple[list[dict], SamplingParams, ToolRequest | None]:
    """(messages to submit, params with the call grammar, the ToolRequest for tool_message).
    `tools` and `tool_choice` are OpenAI's Chat Completions fields; InvalidRequest names a bad one."""
    fields = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls}
    sampling: dict[str, Any] = {}
    if params is not None and params.grammar:
        sampling["grammar"] = params.grammar  # refused beside calls, as in a request
    if params is not None and params.json_schema is not None:
        sampling["json_schema"] = params.json_schema
    prompt, request = chat_with_tools({k: v for k, v in fields.items() if v is not None},
                                      check_messages(messages), sampling, "")
    base = params if params is not None else SamplingParams()
    if "grammar" in sampling and sampling["grammar"] is not base.grammar:
        base = dataclasses.replace(base, grammar=sampling["grammar"])
    return prompt, base.validate(), request


def tool_message(result: Result, tools: ToolRequest | None) -> tuple[dict[str, Any], str]:
    """(the assistant message in OpenAI's shape, the finish_reason: tool_calls when it made calls;
    a thinking answer's reasoning as reasoning_content)."""
    if result.finish_reason not in ("stop", "length"):
        raise InvalidRequest(f"the request ended with {result.finish_reason!r}: {result.error or 'no answer'}")
    message, finish_reason = chat_message(result.text, result.finish_reason, tools, result.tool_syntax)
    return with_reasoning(message, result), finish_reason
