"""The `response` object OpenAI's /v1/responses answers with, made from one Result: its
`output` is, for a thinking answer, a `reasoning` item holding its reasoning as one
`reasoning_text` part (`summary` empty: no summary is written here), then one assistant `message`
item holding one `output_text` part, then, for a request
with function tools, a `function_call` item per call read out of the answer (the message is left
out when the answer is calls alone); `status` is `completed`, or `incomplete` with
`incomplete_details.reason` "max_output_tokens" when the token limit cut the text. The same object is a batch line's `response.body`, the online answer,
what `serve` stores, and what its streamed events carry. Pure: no I/O.
"""
from __future__ import annotations

import secrets
import time
from typing import Any

from ..results import Result
from .responses_request import ResponsesRequest
from .responses_tools import answer_parts, tools_echo


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)  # OpenAI's length; the store checks this shape


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(24)


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def new_reasoning_id() -> str:
    return "rs_" + secrets.token_hex(24)


def reasoning_text_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A thinking answer's reasoning; None text: the item as it opens, before its first part."""
    content = [] if text is None else [reasoning_text_part(text)]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def message_item(message_id: str, text: str | None, status: str) -> dict[str, Any]:
    """The assistant's message; None text: the item as it opens, before its first part."""
    content = [] if text is None else [output_text_part(text)]
    return {"id": message_id, "type": "message", "status": status, "role": "assistant", "content": content}


def response_usage(result: Result) -> dict[str, Any]:
    usage = result.usage
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
            "total_tokens": usage.total_tokens}


def output_items(request: ResponsesRequest, result: Result, status: str, message_id: str | None = None
                 ) -> list[dict[str, Any]]:
    """The output items of a whole answer: its reasoning (a thinking answer's, when it wrote any),
    its message (unless it is calls alone), then its calls. The reasoning is complete once text
    followed it, though max_output_tokens cut the answer (as its stream closed it at that text)."""
    content, calls = answer_parts(result.text, request.tools, result.tool_syntax)
    thought = "completed" if result.text else status
    reasoning = [reasoning_item(new_reasoning_id(), result.reasoning, thought)] if result.reasoning else []
    message = [] if content is None else [message_item(message_id or new_message_id(), content, status)]
    return reasoning + message + calls


def response_object(request: ResponsesRequest, result: Result | None, model: str, *, response_id: str | None = None,
                    message_id: str | None = None, created_at: int | None = None,
                    error: dict[str, str] | None = None, output: list[dict[str, Any]] | None = None
                    ) -> dict[str, Any]:
    """The whole response for a Result that ended with text (stop or length); with `result`
    None, the response in progress (no output yet), or failed when `error` says why. `output`:
    the items a stream already gave out (their ids), instead of reading them from the text."""
    sampling, params = request.sampling, request.params
    body: dict[str, Any] = {
        "id": response_id or new_response_id(), "object": "response",
        "created_at": int(time.time()) if created_at is None else created_at,
        "status": "in_progress", "background": False, "error": None, "incomplete_details": None,
        "instructions": request.instructions, "max_output_tokens": sampling.get("max_tokens"),
        "max_tool_calls": None, "model": model, "output": [],
        "previous_response_id": request.previous_response_id, "reasoning": request.reasoning,
        "service_tier": "default", "store": request.store,
        "temperature": sampling.get("temperature") if params is None else params.temperature,
        "text": {"format": request.text_format}, **tools_echo(request.tools, request.tool_choice), "top_logprobs": 0,
        "top_p": sampling.get("top_p") if params is None else params.top_p,
        "truncation": "disabled", "usage": None, "user": None, "metadata": request.metadata, "completed_at": None,
    }
    if error is not None:
        body.update(status="failed", error=error)
    if result is None:
        return body
    cut = result.finish_reason == "length"
    status = "incomplete" if cut else "completed"
    items = output if output is not None else output_items(request, result, status, message_id)
    body.update(status=status, output=items, usage=response_usage(result), completed_at=None if cut else int(time.time()))
    if cut:
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    return body


def assistant_turn(response: dict[str, Any]) -> dict[str, Any]:
    """A stored response's answer as the chat's assistant turn (its calls as chat's tool_calls,
    its reasoning as reasoning_content), for the chain that continues it: the turn its output
    items sent back as input make (responses_input.py)."""
    turn: dict[str, Any] = {"role": "assistant", "content": output_text(response)}
    output = response.get("output", [])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item.get("type") == "function_call"]
    if calls:
        turn["tool_calls"] = calls
    thoughts = reasoning_text(response)
    if thoughts is not None:
        turn["reasoning_content"] = thoughts
    return turn


def reasoning_text(response: dict[str, Any]) -> str | None:
    """The text of a response's reasoning items, or None when they hold none."""
    parts = [part.get("text", "") for item in response.get("output", []) if item.get("type") == "reasoning"
             for part in item.get("content") or [] if part.get("type") == "reasoning_text"]
    return "".join(parts) if parts else None


def output_text(response: dict[str, Any]) -> str:
    """The text of a response's message items (what the SDK's `output_text` joins)."""
    return "".join(part.get("text", "") for item in response.get("output", []) if item.get("type") == "message"
                   for part in item.get("content", []) if part.get("type") == "output_text")
