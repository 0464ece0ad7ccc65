"""A streamed /v1/responses answer as OpenAI's typed server-sent events, each an `event:` line
naming its type and a `data:` line holding it with its `sequence_number`:

    response.created, response.in_progress          the response, status in_progress, no output
    response.output_item.added, content_part.added  a thinking answer's reasoning item and its
    response.reasoning_text.delta ...               reasoning_text part, one delta per piece, then
    response.reasoning_text.done, content_part.done its .done events, before the message opens
    response.output_item.done
    response.output_item.added                      the assistant message item, empty
    response.content_part.added                     its output_text part, empty
    response.output_text.delta                      one per piece of text
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed                              the whole response (as unstreamed)

With function tools the answer is read as it comes (openai_format's ToolCallSplitter): the
message opens at its first text, and each call, once it closes, is a `function_call` item of its
own: response.output_item.added (arguments ""), response.function_call_arguments.delta (the
arguments whole), response.function_call_arguments.done, response.output_item.done.

A response cut by max_output_tokens ends with `response.incomplete` instead, and one that fails
once the stream has begun with `response.failed` (its `error` says why), as OpenAI's do. No
`data: [DONE]` follows: Responses streams end with their last event.
"""
from __future__ import annotations

import json
import time
from typing import Any

from ...openai_format import (ResponsesRequest, ToolCallSplitter, function_call_item, message_item, new_message_id,
                              new_reasoning_id, new_response_id, output_text_part, reasoning_item, reasoning_text_part,
                              response_object)
from ...constraints.tool_syntax import HERMES
from ...results import Result


class ResponseEvents:
    def __init__(self, request: ResponsesRequest, model: str, tool_syntax: Any = None):
        """`tool_syntax`: the engine's template's call syntax (sse.engine_tool_syntax)."""
        self.request = request
        self.model = model
        self.response_id = new_response_id()
        self.created_at = int(time.time())
        self.sequence = 0
        tools = request.tools
        self.splitter = ToolCallSplitter(tool_syntax or HERMES) if tools is not None and tools.calls_allowed else None
        self.items: list[dict[str, Any]] = []  # the output items given out whole so far
        self.message_id: str | None = None  # the message item open now
        self.pieces: list[str] = []
        self.reasoning_id: str | None = None  # the reasoning item open now
        self.thoughts: list[str] = []
        self.final: dict[str, Any] | None = None  # the whole response, once it completed

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return (f"event: {kind}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode("utf-8")
                + b"\n\n")

    def _response(self, result: Result | None, error: dict[str, str] | None = None) -> dict[str, Any]:
        return response_object(self.request, result, self.model, response_id=self.response_id,
                               created_at=self.created_at, error=error,
                               output=self.items if result is not None else None)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": len(self.items), "content_index": 0}

    def opening(self) -> bytes:
        started = self._response(None)
        out = self._event("response.created", response=started) + self._event("response.in_progress", response=started)
        return out  # the message opens at its first text: a thinking answer's reasoning item comes before it

    def reasoning(self, text: str) -> bytes:
        """A piece of a thinking answer's reasoning (its item opens at the first)."""
        out = b""
        if self.reasoning_id is None:
            self.reasoning_id, self.thoughts = new_reasoning_id(), []
            out = (self._event("response.output_item.added", output_index=len(self.items),
                               item=reasoning_item(self.reasoning_id, None, "in_progress"))
                   + self._event("response.content_part.added", **self._reasoning_at(), part=reasoning_text_part("")))
        self.thoughts.append(text)
        return out + self._event("response.reasoning_text.delta", **self._reasoning_at(), delta=text)

    def _reasoning_at(self) -> dict[str, Any]:
        return {"item_id": self.reasoning_id, "output_index": len(self.items), "content_index": 0}

    def _close_reasoning(self, status: str) -> bytes:
        if self.reasoning_id is None:
            return b""
        item = reasoning_item(self.reasoning_id, "".join(self.thoughts), status)
        part = item["content"][0]
        out = (self._event("response.reasoning_text.done", **self._reasoning_at(), text=part["text"])
               + self._event("response.content_part.done", **self._reasoning_at(), part=part)
               + self._event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        self.reasoning_id = None
        return out

    def delta(self, text: str) -> bytes:
        """A piece of the answer after the reasoning (which closes at the first)."""
        closed = self._close_reasoning("completed")
        if self.splitter is None:
            return closed + self._text(text)
        return closed + b"".join(self._text(value) if kind == "content" else self._call(value)
                        for kind, value in self.splitter.feed(text))

    def _open_message(self) -> bytes:
        self.message_id, self.pieces = new_message_id(), []
        return (self._event("response.output_item.added", output_index=len(self.items),
                            item=message_item(self.message_id, None, "in_progress"))
                + self._event("response.content_part.added", **self._at(), part=output_text_part("")))

    def _text(self, text: str) -> bytes:
        opened = self._open_message() if self.message_id is None else b""
        self.pieces.append(text)
        return opened + self._event("response.output_text.delta", **self._at(), delta=text, logprobs=[])

    def _close_message(self, status: str) -> bytes:
        item = message_item(self.message_id or "", "".join(self.pieces), status)
        out = (self._event("response.output_text.done", **self._at(), text=item["content"][0]["text"], logprobs=[])
               + self._event("response.content_part.done", **self._at(), part=item["content"][0])
               + self._event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        self.message_id = None
        return out

    def _call(self, call: dict[str, Any]) -> bytes:
        out = self._close_message("completed") if self.message_id is not None else b""
        item = function_call_item(call)
        at = {"item_id": item["id"], "output_index": len(self.items)}
        out += (self._event("response.output_item.added", output_index=len(self.items),
                            item={**item, "arguments": "", "status": "in_progress"})
                + self._event("response.function_call_arguments.delta", **at, delta=item["arguments"])
                + self._event("response.function_call_arguments.done", **at, name=item["name"],
                              arguments=item["arguments"])
                + self._event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        return out

    def ending(self, result: Result) -> bytes:
        """The closing events; the response they carry (`final`) is the one a GET returns."""
        status = "incomplete" if result.finish_reason == "length" else "completed"
        out = self._close_reasoning(status)
        if self.splitter is not None:  # what it still holds (an unclosed call is text)
            out += b"".join(self._text(value) if kind == "content" else self._call(value)
                            for kind, value in self.splitter.finish())
        if self.message_id is None and all(item["type"] == "reasoning" for item in self.items):
            # as unstreamed: an answer with no text and no call (reasoning alone, or nothing) has an empty message
            out += self._open_message()
        if self.message_id is not None:
            out += self._close_message(status)
        final = self.final = self._response(result)
        return out + self._event("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                                 response=final)

    def failed(self, error: dict[str, Any]) -> bytes:
        """A request that failed after the stream began: the response, failed, with OpenAI's error."""
        return self._event("response.failed", response=self._response(
            None, {"code": error.get("code") or "server_error", "message": error.get("message", "")}))
