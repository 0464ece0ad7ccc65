"""Tool calls out of an answer's text, in OpenAI's shape: `message.tool_calls` for a whole answer
and `delta.tool_calls` chunks for a streamed one.

The text holds calls in the syntax the engine constrained (constraints/tool_syntax.py; the
Result's `tool_syntax`), Hermes/Qwen's by default:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. The text between calls is the
message's content, except stretches that are only whitespace (the newlines between calls),
which are dropped; content is null when nothing else is left. A call that never closes (the
answer hit max_tokens inside it) is no call: its text stays in the content, as written.

Streamed and whole answers split the same way, so a stream's deltas join to the whole answer.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..constraints.tool_syntax import HERMES, ToolSyntax, syntax_named


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments_text(arguments)}}


def arguments_text(arguments: Any) -> str:
    """A call's arguments as OpenAI's JSON string. A lone surrogate the model escaped ("\\ud800")
    cannot be UTF-8 (the response would not encode): such arguments keep their escapes."""
    text = json.dumps(arguments, ensure_ascii=False)
    return text if _is_text(text) else json.dumps(arguments)


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_call(value: Any) -> dict[str, Any] | None:
    """{"name", "arguments"} from a call's JSON value, or None when it is no call."""
    if not (isinstance(value, dict) and isinstance(value.get("name"), str) and _is_text(value["name"])):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return {"name": value["name"], "arguments": arguments}


def _read_calls(body: str, syntax: ToolSyntax) -> list[dict[str, Any]] | None:
    """The calls of one call's text (a listed syntax: of its array), or None when it is none."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    values = value if syntax.listed and isinstance(value, list) else [value]
    if syntax.listed and not isinstance(value, list):
        return None
    calls = [_read_call(v) for v in values]
    return None if not calls or any(c is None for c in calls) else calls


def _json_end(text: str) -> int | None:
    """Where the JSON object or array at the start of `text` ends (-1: it is none; None: not yet)."""
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return None
    if text[start] not in "{[":
        return -1
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


@dataclass
class ToolCallSplitter:
    """Reads an answer piece by piece; `feed` and `finish` give ("content", text) and
    ("call", {"name", "arguments"}) events in order. The whole-text split is the same splitter."""

    syntax: ToolSyntax = HERMES
    _pending: str = ""  # text not yet given out: a possible start of the opener, or a call being read
    _in_call: bool = False
    _segment: str = ""  # content of the current stretch held while it is only whitespace
    _segment_shown: bool = False  # the current stretch already gave out text
    calls: int = field(default=0)

    def feed(self, text: str) -> list[tuple[str, Any]]:
        self._pending += text
        events: list[tuple[str, Any]] = []
        trigger = self.syntax.trigger
        while True:
            if self._in_call:
                read = self._take_call()
                if read is None:
                    return events
                written, calls = read
                self._in_call = False
                if calls is None:  # not a call after all (unconstrained text): it is content
                    events += self._content(written)
                    continue
                self.calls += len(calls)
                self._segment, self._segment_shown = "", False
                events += [("call", call) for call in calls]
                continue
            start = self._pending.find(trigger)
            if start >= 0:
                events += self._content(self._pending[:start])
                self._pending = self._pending[start + len(trigger):]
                self._in_call = True
                continue
            keep = _partial_opener(self._pending, trigger)
            events += self._content(self._pending[:len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep:]
            return events

    def _take_call(self) -> tuple[str, list | None] | None:
        """(the call's text as written, its calls or None when it is no call), taken off the
        pending text; None while the call has not closed yet."""
        syntax = self.syntax
        if syntax.closer:
            closer = syntax.closer.strip()
            end = self._pending.find(closer)
            if end < 0:
                return None
            body, self._pending = self._pending[:end], self._pending[end + len(closer):]
            return syntax.trigger + body + closer, _read_calls(body.strip(), syntax)
        head = syntax.trigger if syntax.trigger_in_json else ""
        text = head + self._pending
        end = _json_end(text)
        if end is None:
            return None
        if end < 0:  # the opener is not followed by JSON: it was text
            self._pending = text if head else self._pending
            written = "" if head else syntax.trigger
            return written, None
        body, self._pending = text[:end], text[end:]
        return (body if head else syntax.trigger + body), _read_calls(body.strip(), syntax)

    def finish(self) -> list[tuple[str, Any]]:
        """The rest at the end of the answer: an unclosed call's text is content."""
        rest = (self.syntax.trigger if self._in_call else "") + self._pending
        self._pending, self._in_call = "", False
        events = self._content(rest)
        if self.calls == 0 and self._segment:  # an answer of whitespace alone: kept as written
            events.append(("content", self._segment))
            self._segment = ""
        return events

    def _content(self, text: str) -> list[tuple[str, Any]]:
        if not text:
            return []
        if self._segment_shown:
            return [("content", text)]
        self._segment += text
        if not self._segment.strip():
            return []  # only whitespace so far: held (dropped if a call comes next)
        out, self._segment, self._segment_shown = self._segment, "", True
        return [("content", out)]


def _partial_opener(text: str, opener: str) -> int:
    """How many characters at the end of `text` could be the start of `opener`."""
    for n in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-n:]):
            return n
    return 0


def split_tool_calls(text: str, syntax: ToolSyntax = HERMES) -> tuple[str | None, list[dict[str, Any]]]:
    """(content or None, calls as {"name", "arguments"}) of a whole answer."""
    splitter = ToolCallSplitter(syntax)
    events = splitter.feed(text) + splitter.finish()
    content = "".join(value for kind, value in events if kind == "content")
    calls = [value for kind, value in events if kind == "call"]
    if not calls:
        return text, []
    return (content or None), calls


def chat_message(text: str, finish_reason: str, tools: Any, syntax: str | None = None) -> tuple[dict[str, Any], str]:
    """(the assistant message, its finish_reason) of a chat answer; with a ToolRequest whose
    calls are allowed, its calls in OpenAI's shape and finish_reason tool_calls (function_call
    for a request made with the legacy `functions`). `syntax`: the Result's tool_syntax."""
    if tools is None or not tools.calls_allowed:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = split_tool_calls(text, syntax_named(syntax))
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    done = finish_reason == "stop"
    if tools.legacy:
        call = calls[0]
        function = {"name": call["name"], "arguments": arguments_text(call["arguments"])}
        return ({"role": "assistant", "content": content, "function_call": function},
                "function_call" if done else finish_reason)
    return ({"role": "assistant", "content": content, "tool_calls": [openai_call(c["name"], c["arguments"]) for c in calls]},
            "tool_calls" if done else finish_reason)


def plain_tool_fields(text: str, finish_reason: str, tools: Any, syntax: str | None = None) -> dict[str, Any]:
    """A plain record's text, tool_calls (always there, [] without calls: one column in tables)
    and finish_reason, for a line that gave tools."""
    if not tools.calls_allowed:
        return {"text": text, "tool_calls": [], "finish_reason": finish_reason}
    content, calls = split_tool_calls(text, syntax_named(syntax))
    return {"text": content or "", "tool_calls": [openai_call(c["name"], c["arguments"]) for c in calls],
            "finish_reason": "tool_calls" if calls and finish_reason == "stop" else finish_reason}


def result_tool_fields(result: Any, tools: Any) -> dict[str, Any]:
    """plain_tool_fields for a Result: n > 1 (result.samples) gives `texts`, `finish_reasons`
    and `tool_calls` one per sample, as a record's texts are."""
    if result.samples is None:
        return plain_tool_fields(result.text, result.finish_reason, tools, result.tool_syntax)
    each = [plain_tool_fields(s.text, s.finish_reason, tools, result.tool_syntax) for s in result.samples]
    return {"texts": [e["text"] for e in each], "finish_reasons": [e["finish_reason"] for e in each],
            "tool_calls": [e["tool_calls"] for e in each]}
