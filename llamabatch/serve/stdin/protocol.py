"""The serve-stdin JSONL protocol: parsing one input line, building one output event.

Pure functions and plain dataclasses, no I/O and no threads, so every rule is unit-testable.
The I/O loop that uses them lives in `loop.py` beside it.

Input lines are requests (`{"id", "prompt" | "messages", "stream", <sampling fields>}`),
embeddings requests (`{"id", "input", <EMBED_KEYS>}`: one terminal event with the vectors) or
control ops (`{"op": "cancel", "id"}`, `{"op": "stats"}`). A line that can't be used raises
BadLine, which carries what the error event needs: the id when one was readable, the line
number always.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Union

from ...errors import InvalidRequest
from ...files.json_line import BadJSON, loads, sniff_id
from ...params import SamplingParams
from ...openai_format import check_messages, check_prompt, is_int, is_request_id, json_kind
from ...results import EmbeddingResult, Result
from ...openai_format import check_encoding, encode_vector
from ...openai_format import TOOL_BODY_FIELDS, chat_with_tools, result_tool_fields

# Keys of a request line that are not sampling parameters.
REQUEST_KEYS = ("id", "prompt", "messages", "stream")
OPS = ("cancel", "stats")
# Keys of an embeddings request line (one with "input"), besides "id".
EMBED_KEYS = ("input", "encoding_format", "dimensions", "pooling", "normalize", "truncate", "timeout")

RequestId = Union[str, int]


@dataclass
class Submit:
    id: RequestId
    prompt: Any  # text, token ids or chat messages: the engine checks the content
    params: SamplingParams
    stream: bool
    line: int
    embed: "EmbedSpec | None" = None  # an embeddings request: engine.submit_embedding
    tools: Any = None  # a chat request's ToolRequest: its done event carries tool_calls


@dataclass
class EmbedSpec:
    """What an embeddings request line asks for (the engine checks the inputs themselves)."""

    inputs: Any
    encoding_format: str = "float"
    dimensions: int | None = None
    pooling: str | None = None
    normalize: bool = True
    truncate: bool = False
    timeout: float | None = None


@dataclass
class Cancel:
    id: RequestId
    line: int


@dataclass
class Stats:
    line: int
    id: RequestId | None = None  # echoed back when given, so a client can match the answer


Command = Union[Submit, Cancel, Stats]


class BadLine(Exception):
    """An input line that gets an error event instead of being run."""

    def __init__(self, code: str, message: str, line: int, id: RequestId | None = None, op: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.line = line
        self.id = id
        self.op = op

    def event(self) -> dict[str, Any]:
        return error_event(self.id, self.code, self.message, line=self.line, op=self.op)


def parse_line(text: str | bytes, line: int, defaults: SamplingParams) -> Command | None:
    """One input line -> a command, or None for a blank line. Raises BadLine.

    `defaults` are the resolved sampling settings (flags, env, config file) that a
    request's own fields override.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadLine("invalid_json", f"line {line} is not UTF-8: {exc.reason} at byte {exc.start}", line) from None
    if not text.strip():
        return None
    try:
        data = loads(text)
    except BadJSON as bad:
        # The id, where the line states it plainly, lets the client match the error to its request.
        request_id = sniff_id(text)
        if bad.code == "invalid_json":
            raise BadLine("invalid_json", f"line {line} is not JSON: {bad.message}", line, request_id) from None
        raise BadLine(bad.code, f"line {line}: {bad.message}", line, request_id) from None
    if not isinstance(data, dict):
        raise BadLine("invalid_json", f"line {line} must be a JSON object, got {json_kind(data)}", line)
    if "op" in data:
        return _parse_op(data, line)
    return _parse_request(data, line, defaults)


def _parse_op(data: dict[str, Any], line: int) -> Command:
    op = data["op"]
    if op not in OPS:
        raise BadLine("unknown_op", f"unknown op {op!r} (known: {', '.join(OPS)})", line,
                      _readable_id(data), op=op if isinstance(op, str) else None)
    extra = sorted(k for k in data if k not in ("op", "id"))
    if extra:
        raise BadLine("invalid_request", f"op {op!r} takes only 'id', got {', '.join(map(repr, extra))}", line,
                      _readable_id(data), op=op)
    if op == "cancel":
        if "id" not in data:
            raise BadLine("invalid_request", "op 'cancel' needs the 'id' of the request to cancel", line, op=op)
        return Cancel(_check_id(data["id"], line, op), line)
    return Stats(line, _check_id(data["id"], line, op) if "id" in data else None)


def _parse_request(data: dict[str, Any], line: int, defaults: SamplingParams) -> Submit:
    request_id = _check_id(data["id"], line) if "id" in data else f"line-{line}"

    def bad(message: str) -> BadLine:
        return BadLine("invalid_request", message, line, request_id)

    has_prompt, has_messages = "prompt" in data, "messages" in data
    if "input" in data:
        return _parse_embed(data, line, request_id, defaults, bad)
    if has_prompt == has_messages:
        raise bad("a request needs exactly one of 'prompt' or 'messages'" if not has_prompt
                  else "a request takes 'prompt' or 'messages', not both")
    try:
        prompt = check_prompt(data["prompt"]) if has_prompt else check_messages(data["messages"])
    except InvalidRequest as exc:
        raise bad(str(exc)) from None
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise bad(f"stream must be true or false, got {json.dumps(stream)}")
    sampling = {k: v for k, v in data.items() if k not in REQUEST_KEYS and k not in TOOL_BODY_FIELDS}
    tools = None
    try:
        if has_messages:
            prompt, tools = chat_with_tools(data, prompt, sampling, "")  # tools, tool turns, the call grammar
        elif any(k in data for k in TOOL_BODY_FIELDS):
            raise InvalidRequest("tools need a chat request: give messages, not prompt")
        params = SamplingParams.from_dict(sampling, base=defaults)
    except InvalidRequest as exc:
        raise bad(str(exc)) from None
    return Submit(request_id, prompt, params, stream, line, tools=tools)


def _parse_embed(data: dict[str, Any], line: int, request_id: RequestId, defaults: SamplingParams,
                 bad: Any) -> Submit:
    extra = sorted(k for k in data if k not in ("id", *EMBED_KEYS))
    if extra:
        raise bad(f"an embeddings request (one with 'input') takes {', '.join(EMBED_KEYS)}; "
                  f"got {', '.join(map(repr, extra))}")
    try:
        encoding = check_encoding(data.get("encoding_format"))
    except InvalidRequest as exc:
        raise bad(str(exc)) from None
    for key in ("normalize", "truncate"):
        if key in data and not isinstance(data[key], bool):
            raise bad(f"{key} must be true or false, got {json.dumps(data[key])}")
    dims = data.get("dimensions")
    if dims is not None and (not is_int(dims) or dims <= 0):
        raise bad(f"dimensions must be an integer >= 1, got {json.dumps(dims)}")
    timeout = data.get("timeout", defaults.timeout)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise bad(f"timeout must be a number of seconds > 0, got {json.dumps(timeout)}")
    spec = EmbedSpec(data["input"], encoding, dims, data.get("pooling"), data.get("normalize", True),
                     data.get("truncate", False), timeout)
    return Submit(request_id, data["input"], defaults, False, line, embed=spec)


def _check_id(value: Any, line: int, op: str | None = None) -> RequestId:
    # Strings and integers, echoed back exactly as given; anything else can't be matched reliably.
    if isinstance(value, str) and value:
        return value
    if is_int(value):
        return value
    raise BadLine("invalid_request", f"id must be a non-empty string or an integer, got {json.dumps(value)}",
                  line, op=op)


def _readable_id(data: dict[str, Any]) -> RequestId | None:
    value = data.get("id")
    return value if is_request_id(value) else None


# -- events ------------------------------------------------------------------------------------


def ready_event(model: str, n_parallel: int, n_ctx: int, slot_ctx: int) -> dict[str, Any]:
    return {"event": "ready", "model": model, "n_parallel": n_parallel, "n_ctx": n_ctx, "slot_ctx": slot_ctx}


def token_event(request_id: RequestId, text: str, index: int | None = None, reasoning: str = "") -> dict[str, Any]:
    """`index` (n > 1 only) names the sample the text belongs to; `reasoning`, a thinking
    answer's reasoning text (only where there is some: `text` is then the answer's)."""
    event: dict[str, Any] = {"id": request_id, "event": "token", "text": text}
    if reasoning:
        event["reasoning"] = reasoning
    if index is not None:
        event["index"] = index
    return event


def error_event(request_id: RequestId | None, code: str, message: str, *, line: int | None = None,
                op: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {}
    if request_id is not None:
        event["id"] = request_id
    event["event"] = "error"
    if op is not None:
        event["op"] = op  # answers a control line: not a request's terminal event
    event["error"] = {"code": code, "message": message}
    if line is not None:
        event["line"] = line
    return event


def cancel_ignored_event(request_id: RequestId, line: int, reason: str) -> dict[str, Any]:
    """The reply to a cancel line that did not end its request: the request ended some other
    way first (`"already finished"`), or an earlier cancel line already ended it
    (`"already cancelled"`). With it every cancel line gets exactly one reply."""
    return {"id": request_id, "event": "cancel_ignored", "op": "cancel", "reason": reason, "line": line}


def terminal_event(request_id: RequestId, result: Result | EmbeddingResult, line: int | None = None,
                   encoding_format: str = "float", tools: Any = None) -> dict[str, Any]:
    """A request's one terminal event: `done` (stop, length, cancelled, timeout) or `error`.
    An embeddings request's `done` carries "embeddings" (one per input, in order)."""
    if result.finish_reason == "error":
        return error_event(request_id, result.error_code or "error", result.error or "request failed", line=line)
    if isinstance(result, EmbeddingResult):
        fields = result.to_dict()
        del fields["error"]
        fields["embeddings"] = [encode_vector(v, encoding_format) for v in result.vectors]
        return {"id": request_id, "event": "done", **fields}
    fields = result.to_dict()  # n > 1: "texts" and "finish_reasons", one per sample
    del fields["error"]
    event: dict[str, Any] = {"id": request_id, "event": "done", **fields}
    if tools is not None:  # the calls read out of the text, as run's records do
        event.update(result_tool_fields(result, tools))
    if result.samples is not None:
        if any(s.stop is not None for s in result.samples):
            event["stops"] = [s.stop for s in result.samples]
    elif result.stop is not None:
        event["stop"] = result.stop
    if result.deterministic:
        event["deterministic"] = True
    if result.logprobs is not None:
        event["logprobs"] = result.all_logprobs
    return event


def stats_event(stats: dict[str, Any], telemetry: dict[str, Any], request_id: RequestId | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {} if request_id is None else {"id": request_id}
    event["event"] = "stats"
    event.update(stats)
    event.update(telemetry)
    return event


def encode(event: dict[str, Any]) -> bytes:
    """One output line. ensure_ascii keeps it plain ASCII: no encoding surprises in any reader,
    and JSON's escapes round-trip every string (lone surrogates too)."""
    return (json.dumps(event, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")
