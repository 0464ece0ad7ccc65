"""Streamed answers as server-sent events, in OpenAI's chunk shapes: `chat.completion.chunk`
(a `delta` with the role first, then content) or `text_completion` (a `text` piece), one
`data:` event each, the finish reasons in a last chunk, usage in one more when the request
asked with stream_options.include_usage, then `data: [DONE]`."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ...api import ChatEngine
from ...constraints.tool_syntax import HERMES, ToolSyntax
from ...openai_format import CHAT_URL, ToolCallSplitter, openai_call, usage_details
from ...results import Delta, Result

DONE = b"data: [DONE]\n\n"


def engine_tool_syntax(engine: Any) -> ToolSyntax:
    """The call syntax of the engine's chat template (an engine without one here, the Ray pool: Hermes)."""
    template = engine.chat_template if isinstance(engine, ChatEngine) else None
    return template.tool_syntax if template is not None else HERMES


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


class StreamShape:
    def __init__(self, url: str, model: str, samples: int, tools: Any = None, tool_syntax: Any = HERMES):
        self.chat = url == CHAT_URL
        # a chat request whose answer may hold tool calls: each sample's text is split as it comes
        # (openai_format/tool_calls.py), calls sent whole as delta.tool_calls once they close
        self.tools = tools if self.chat and tools is not None and tools.calls_allowed else None
        self.splitters: dict[int, ToolCallSplitter] = {}
        self.tool_syntax = tool_syntax  # the engine's template's (the engine rebuilds the mask in it)
        self.model = model
        self.samples = samples
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return event({"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                      "created": self.created, "model": self.model, "choices": choices, **extra})

    def _choice(self, index: int, piece: Any, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            return {"index": index, "delta": piece, "logprobs": None, "finish_reason": finish_reason}
        return {"index": index, "text": piece, "logprobs": None, "finish_reason": finish_reason}

    def opening(self) -> bytes:
        """Chat's first chunk names the role (with empty content), as OpenAI's does."""
        if not self.chat:
            return b""
        return self._chunk([self._choice(i, {"role": "assistant", "content": ""}, None) for i in range(self.samples)])

    def delta(self, delta: Delta) -> bytes:
        reasoning = b""
        if delta.reasoning and self.chat:  # a thinking answer's reasoning: its own chunks, before the content
            reasoning = self._chunk([self._choice(delta.index, {"reasoning_content": delta.reasoning}, None)])
        if not delta.text:
            return reasoning
        return reasoning + self._content(delta)

    def _content(self, delta: Delta) -> bytes:
        if self.tools is not None:
            splitter = self.splitters.setdefault(delta.index, ToolCallSplitter(self.tool_syntax))
            return self._tool_events(delta.index, splitter, splitter.feed(delta.text))
        return self._chunk([self._choice(delta.index, {"content": delta.text} if self.chat else delta.text, None)])

    def _tool_events(self, index: int, splitter: ToolCallSplitter, events: list) -> bytes:
        out = b""
        for kind, value in events:
            if kind == "content":
                out += self._chunk([self._choice(index, {"content": value}, None)])
            elif self.tools.legacy:
                call = openai_call(value["name"], value["arguments"])
                out += self._chunk([self._choice(index, {"function_call": call["function"]}, None)])
            else:  # the call's place among this sample's calls: OpenAI's delta.tool_calls[].index
                call = {"index": splitter.calls - 1, **openai_call(value["name"], value["arguments"])}
                out += self._chunk([self._choice(index, {"tool_calls": [call]}, None)])
        return out

    def _finish_reason(self, index: int, finish_reason: str) -> str:
        splitter = self.splitters.get(index)
        if splitter is None or not splitter.calls or finish_reason != "stop":
            return finish_reason
        return "function_call" if self.tools.legacy else "tool_calls"

    def ending(self, result: Result, include_usage: bool) -> bytes:
        samples = result.samples if result.samples is not None else [result]
        out = b""
        if self.tools is not None:  # what each splitter still holds (an unclosed call is content)
            for index, splitter in sorted(self.splitters.items()):
                out += self._tool_events(index, splitter, splitter.finish())
        out += self._chunk([self._choice(i, {} if self.chat else "", self._finish_reason(i, r.finish_reason))
                            for i, r in enumerate(samples)])
        if include_usage:
            usage = {"prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
                     "total_tokens": result.usage.total_tokens}
            details = usage_details(result.usage)
            if details is not None:
                usage["completion_tokens_details"] = details
            out += self._chunk([], usage=usage)
        return out

    def error(self, body: dict[str, Any]) -> bytes:
        """A request that failed after the stream began: OpenAI's error object as one event."""
        return event(body)
