"""Line and body shapes for `run`, `serve` and `serve-stdin`: parsing one input line, building one output record.

Input lines:
  - text: one prompt per line (a `.txt` file, `--input-format text`, or auto-detected input
    whose first line does not start with `{` or `[`),
  - `{"prompt": ..., "id": ..., <sampling fields>}` and `{"messages": [...], "id": ...}`,
  - OpenAI Batch API lines `{"custom_id", "method": "POST", "url", "body"}` (chat, completions,
    embeddings and responses, mixed freely; responses_request.py reads a responses body),
  - `{"input": ..., "id": ...}`: an embeddings line (with `--embed`, text lines and `prompt`
    lines are embeddings too).
Output records: a plain shape (`id`, `text`, `finish_reason`, `usage`, `timings`, `seed`,
`error`, optional `input`) and the OpenAI Batch output shape (see shared/formats.md).

Pure functions and dataclasses: no I/O, no threads, no model, so every rule is unit-testable.
A line that can't be run becomes a `LineError`, which is written as that line's error record.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Union

from ..errors import InvalidRequest
from ..files.json_line import BadJSON, loads, sniff_id
from ..params import FIELD_TYPES, SamplingParams
from .fields import is_int, is_request_id, json_kind
from ..results import EmbeddingResult, Result, Timings, Usage
from .ignored_fields import noted_fields
from .embed_records import EmbedLine, embedding_body, plain_embedding_record
from .logprobs import chat_logprobs, completion_logprobs
from .responses_object import response_object
from .responses_request import RESPONSES_URL, ResponsesRequest, parse_responses_body
from .reasoning import usage_details, with_reasoning
from .tool_calls import chat_message, result_tool_fields
from .tool_lines import chat_with_tools
from .tools_request import TOOL_BODY_FIELDS, ToolRequest
from .request_body import (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, checked_messages, checked_prompt, embed_body,
                           embed_line, map_body, with_tier)

URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL)
INPUT_FORMATS = ("auto", "text", "jsonl")
PLAIN, OPENAI = "plain", "openai"  # output shapes

# Keys of a plain JSONL line that are neither sampling fields nor extra (echoed) data.
PLAIN_KEYS = ("id", "prompt", "messages", "system")
# Codes of errors caused by the line itself (HTTP 400 in the OpenAI shape); others are 500.
CLIENT_ERROR_CODES = ("invalid_json", "unknown_shape", "invalid_url", "invalid_request", "duplicate_id",
                      "context_overflow")

LineId = Union[str, int]
# The id of a line whose own id could not be read (not JSON, not an object, an id or custom_id
# that is no id). Every user id is a non-empty string or an integer, so null never equals
# one: a bad line can't make a later line a duplicate, and --resume counts these records
# (id_sets.Answered) instead of matching them.
NO_ID = None


@dataclass
class LineRequest:
    """A line ready for `Engine.submit(prompt, params)`."""

    line_no: int
    id: LineId
    prompt: Any  # text, token ids or chat messages: the engine checks the content
    params: SamplingParams
    shape: str = PLAIN  # the output shape its record takes
    url: str | None = None  # the OpenAI endpoint, which picks the response object
    echo: dict | None = None  # with --echo: copied into the plain record under "input"
    row: int | None = None  # table inputs: the data row number, written as the record's "row"
    embed: EmbedLine | None = None  # an embeddings line: engine.submit_embedding, not submit
    responses: ResponsesRequest | None = None  # a /v1/responses line: what its response object echoes
    tools: ToolRequest | None = None  # a chat line's tools: its answer's calls are read out (tool_calls.py)
    ignored: tuple[str, ...] = ()  # body fields accepted with no effect, named in its record (ignored_fields.py)


@dataclass
class LineError:
    """A line that gets an error record instead of being run."""

    line_no: int
    id: LineId | None  # NO_ID: the line names no id that could be read
    code: str
    message: str
    shape: str = PLAIN
    url: str | None = None
    echo: dict | None = None  # table inputs: the kept columns, so a failed row can be joined back too
    row: int | None = None  # table inputs: the data row number

    def result(self) -> Result:
        return error_result(self.code, self.message)


class _Bad(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _as_bad(exc: Exception) -> _Bad:
    return exc if isinstance(exc, _Bad) else _Bad("invalid_request", str(exc))


class LineParser:
    """Turns input lines into LineRequest / LineError. `defaults` are the resolved sampling
    settings (flags, env, config) that a line's own fields override; `system` is --system."""

    def __init__(self, defaults: SamplingParams, *, input_format: str = "auto", system: str | None = None,
                 echo: bool = False, embed: bool = False):
        if input_format not in INPUT_FORMATS:
            raise InvalidRequest(f"input format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
        self.defaults = defaults
        self.input_format = input_format
        self.system = system
        self.echo = echo
        self.embed = embed  # --embed: text lines and {"prompt"} lines are embeddings inputs

    def parse(self, raw: str | bytes, line_no: int) -> LineRequest | LineError | None:
        """One input line (with or without its line ending) -> request, error, or None when blank.
        Never raises: whatever the line holds, it gets an answer of its own."""
        try:
            return self._parse(raw, line_no)
        except Exception as exc:  # a bug here must cost this line, never the run
            return self._unnamed(line_no, "internal_error", f"{type(exc).__name__}: {exc}")

    def _parse(self, raw: str | bytes, line_no: int) -> LineRequest | LineError | None:
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return self._unnamed(line_no, "invalid_json",
                                     f"line {line_no} is not UTF-8: {exc.reason} at byte {exc.start}")
        text = raw.rstrip("\r\n")
        if line_no == 1:
            text = text.lstrip("\ufeff")  # a BOM some editors write
        if not text.strip():
            return None
        if self.input_format == "auto":
            # The first line that says anything decides for the whole input: in a JSON-lines
            # file a line that is not JSON is corruption (a torn write, a NUL-filled block),
            # never a prompt to run.
            self.input_format = "jsonl" if text.lstrip()[:1] in ("{", "[") else "text"
        if self.input_format == "text":
            return self._text(text, line_no)
        try:
            data = loads(text)
        except BadJSON as bad:
            if bad.code == "invalid_json":
                return _malformed(text, line_no, f"line {line_no} is not valid JSON: {bad.message}")
            custom_id = sniff_id(text, "custom_id")
            if custom_id is not None:
                return LineError(line_no, _custom_id_or_none(custom_id), bad.code, f"line {line_no}: {bad.message}",
                                 OPENAI)
            return LineError(line_no, _id_or_none(sniff_id(text)), bad.code, f"line {line_no}: {bad.message}")
        return self._shaped(data, line_no)

    def parse_object(self, data: Any, line_no: int) -> LineRequest | LineError:
        """A line already read as JSON (and checked: json_line.loads), e.g. serve's online body in
        its batch-line shape, which is then not one level deeper than the body the client sent."""
        try:
            return self._shaped(data, line_no)
        except Exception as exc:  # a bug here must cost this request, never the caller
            return self._unnamed(line_no, "internal_error", f"{type(exc).__name__}: {exc}")

    def _shaped(self, data: Any, line_no: int) -> LineRequest | LineError:
        if not isinstance(data, dict):
            return self._unnamed(line_no, "unknown_shape",
                                 f"line {line_no} is {json_kind(data)}, not an object with prompt, messages or custom_id")
        if any(k in data for k in ("custom_id", "url", "body", "method")):
            return self._openai(data, line_no)
        if "input" in data or (self.embed and "prompt" in data):
            return self._plain_embed(data, line_no)
        if "prompt" in data or "messages" in data:
            return self._plain(data, line_no)
        return LineError(line_no, _plain_id(data, line_no), "unknown_shape",
                         f"line {line_no} has neither 'prompt', 'messages', 'input' nor the OpenAI Batch "
                         "'custom_id', 'url' and 'body'")

    def _unnamed(self, line_no: int, code: str, message: str) -> LineError:
        """The error of a line whose id could not be read. In text input every id is a line
        number (a user gives none), so the line number stays its id there."""
        line_id = line_no if self.input_format == "text" else NO_ID
        return LineError(line_no, line_id, code, _with_line(message, line_no))

    # -- shapes ---------------------------------------------------------------------------

    def _text(self, text: str, line_no: int) -> LineRequest | LineError:
        if "\x00" in text:
            return LineError(line_no, line_no, "invalid_request",
                             f"line {line_no} has NUL characters: not a text prompt (a UTF-16 or binary file? "
                             "prompts files are UTF-8)")
        if self.embed:
            return LineRequest(line_no, line_no, text, self.defaults, echo={"input": text} if self.echo else None,
                               embed=EmbedLine(text))
        prompt = _as_chat(text, self.system) if self.system else text
        return LineRequest(line_no, line_no, prompt, self.defaults, echo={"prompt": text} if self.echo else None)

    def _plain_embed(self, data: dict[str, Any], line_no: int) -> LineRequest | LineError:
        line_id = _plain_id(data, line_no)
        key = "input" if "input" in data else "prompt"
        try:
            if "id" in data:
                _check_id(data["id"])
            unknown = [k for k in data if k not in ("id", key, "encoding_format", "dimensions")]
            if unknown:
                raise _Bad("invalid_request", f"an embeddings line takes id, {key}, encoding_format and "
                                              f"dimensions; got {', '.join(map(repr, unknown))}")
            embed = embed_line(data[key], data.get("encoding_format"), data.get("dimensions"))
        except (_Bad, InvalidRequest) as exc:  # request_body.py's checks raise InvalidRequest
            bad = _as_bad(exc)
            return _plain_error(line_no, line_id, bad)
        echo = {k: v for k, v in data.items() if k != "id"} if self.echo else None
        return LineRequest(line_no, line_id, embed.inputs, self.defaults, echo=echo, embed=embed)

    def _plain(self, data: dict[str, Any], line_no: int) -> LineRequest | LineError:
        line_id = _plain_id(data, line_no)
        try:
            if "id" in data:
                _check_id(data["id"])
            if "prompt" in data and "messages" in data:
                raise _Bad("invalid_request", "a line takes 'prompt' or 'messages', not both")
            system = data.get("system", self.system)
            if system is not None and not isinstance(system, str):
                raise _Bad("invalid_request", f"system must be a string, got {json_kind(system)}")
            if "prompt" in data:
                prompt = checked_prompt(data["prompt"])
                if system and isinstance(prompt, str):
                    prompt = _as_chat(prompt, system)
            sampling = {k: v for k, v in data.items() if k in FIELD_TYPES}
            tools = None
            if "messages" in data:
                prompt, tools = chat_with_tools(data, checked_messages(data["messages"]), sampling, "")
                prompt = _with_system(prompt, system)
            elif any(k in data for k in TOOL_BODY_FIELDS):
                raise _Bad("invalid_request", "tools need a chat line: give messages, not prompt")
            params = _params(sampling, self.defaults)
        except (_Bad, InvalidRequest) as exc:  # request_body.py's checks raise InvalidRequest
            bad = _as_bad(exc)
            return _plain_error(line_no, line_id, bad)
        echo = {k: v for k, v in data.items() if k != "id"} if self.echo else None
        return LineRequest(line_no, line_id, prompt, params, echo=echo, tools=tools)

    def _openai(self, data: dict[str, Any], line_no: int) -> LineRequest | LineError:
        line_id = _custom_id_or_none(data.get("custom_id"))
        url = data.get("url")
        try:
            if line_id is NO_ID:
                raise _Bad("invalid_request", _custom_id_problem(data))
            if url not in URLS:
                raise _Bad("invalid_url", f"unknown url {json.dumps(url)} (supported: {', '.join(URLS)})")
            method = data.get("method", "POST")
            if not (isinstance(method, str) and method.upper() == "POST"):
                raise _Bad("invalid_request", f"method must be POST, got {json.dumps(method)}")
            body = data.get("body")
            if not isinstance(body, dict):
                raise _Bad("invalid_request", f"body must be an object, got {json_kind(body)}")
            if url == EMBEDDINGS_URL:
                embed = embed_body(body)
                return LineRequest(line_no, line_id, embed.inputs, self.defaults, OPENAI, url, embed=embed)
            responses = _responses_body(body) if url == RESPONSES_URL else None  # responses_request.py reads it
            prompt, sampling = (responses.messages(), responses.sampling) if responses else map_body(body, url)
            tools = None
            if url == CHAT_URL:
                prompt, tools = chat_with_tools(body, prompt, sampling, "body.")
            ignored = tuple(noted_fields(body, url == CHAT_URL)) if url in (CHAT_URL, COMPLETIONS_URL) else ()
            if url in (CHAT_URL, RESPONSES_URL):
                prompt = _with_system(prompt, self.system)
            params = _params(with_tier(sampling, body.get("service_tier"), self.defaults), self.defaults)
            if responses:
                responses.params = params
        except (_Bad, InvalidRequest) as exc:  # request_body.py's checks raise InvalidRequest
            bad = _as_bad(exc)
            message = bad.message if line_id is not NO_ID else _with_line(bad.message, line_no)
            return LineError(line_no, line_id, bad.code, message, OPENAI, url if url in URLS else None)
        return LineRequest(line_no, line_id, prompt, params, OPENAI, url, responses=responses, tools=tools,
                           ignored=ignored)


# -- checks and mappings ------------------------------------------------------------------


def _params(sampling: dict[str, Any], defaults: SamplingParams) -> SamplingParams:
    try:
        return SamplingParams.from_dict(sampling, base=defaults)
    except InvalidRequest as exc:
        raise _Bad("invalid_request", str(exc)) from None


def _responses_body(body: dict[str, Any]) -> ResponsesRequest:
    try:
        return parse_responses_body(body)
    except InvalidRequest as exc:
        raise _Bad("invalid_request", str(exc)) from None


def _check_id(value: Any) -> LineId:
    # Strings and integers are echoed back exactly; anything else can't be matched reliably on resume.
    if is_request_id(value):
        return value
    raise _Bad("invalid_request", f"id must be a non-empty string or an integer, got {json.dumps(value)}")


def _plain_id(data: dict[str, Any], line_no: int) -> LineId | None:
    """A plain line's id: its own, the line number when it states none (the documented
    default), NO_ID when what it states is no id."""
    if "id" not in data:
        return line_no
    return _id_or_none(data["id"])


def _id_or_none(value: Any) -> LineId | None:
    return value if is_request_id(value) else NO_ID


def _custom_id_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else NO_ID


def _custom_id_problem(data: dict[str, Any]) -> str:
    if "custom_id" not in data:
        return "custom_id is missing: an OpenAI Batch line needs one, a non-empty string"
    value = data["custom_id"]
    kind = "an empty string" if value == "" else json_kind(value)
    return f"custom_id must be a non-empty string, got {kind}"


def _plain_error(line_no: int, line_id: LineId | None, bad: _Bad) -> LineError:
    message = bad.message if line_id is not NO_ID else _with_line(bad.message, line_no)
    return LineError(line_no, line_id, bad.code, message)


def _with_line(message: str, line_no: int) -> str:
    """A record without an id names its line in the message: the one way to find the line."""
    return message if message.startswith((f"line {line_no}:", f"line {line_no} ")) else f"line {line_no}: {message}"


def _with_system(messages: list[dict], system: str | None) -> list[dict]:
    if not system or any(m.get("role") == "system" for m in messages):
        return messages  # the line's own system message overrides --system
    return [{"role": "system", "content": system}, *messages]


def _as_chat(text: str, system: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def _malformed(text: str, line_no: int, message: str) -> LineError:
    """Malformed JSON still names its custom_id, most often: keep it so the error can be matched."""
    custom_id = sniff_id(text, "custom_id")
    if isinstance(custom_id, str) and custom_id:
        return LineError(line_no, custom_id, "invalid_json", message, OPENAI)
    return LineError(line_no, NO_ID, "invalid_json", message)


# -- output records -----------------------------------------------------------------------


def error_result(code: str, message: str) -> Result:
    """A Result for a line that never reached the engine, so every record is built one way."""
    return Result(-1, "", [], "error", Usage(), Timings(), error=message, error_code=code)


def failed(result: Result) -> bool:
    return result.finish_reason not in ("stop", "length")


def build_record(item: LineRequest | LineError, result: Result | EmbeddingResult, model: str) -> dict[str, Any]:
    """The output record for one line, in the shape its input asked for."""
    embed = item.embed if isinstance(item, LineRequest) else None
    if embed is not None and isinstance(result, EmbeddingResult) and not failed(result):
        if item.shape == OPENAI:
            return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": item.id,
                    "response": {"status_code": 200, "request_id": uuid.uuid4().hex,
                                 "body": embedding_body(result, embed.encoding_format, model)},
                    "error": None}
        return plain_embedding_record(item.id, result, embed.encoding_format, item.echo, item.row)
    if embed is not None and item.shape != OPENAI:  # an embeddings line that failed: no generation fields
        return plain_embedding_record(item.id, EmbeddingResult.ended(result), "float", item.echo, item.row)
    if item.shape == OPENAI:
        record = openai_record(item.id, item.url, result, model, responses=getattr(item, "responses", None),
                               tools=getattr(item, "tools", None))
        if getattr(item, "ignored", ()):
            record["ignored_fields"] = list(item.ignored)
        return record
    return plain_record(item.id, result, item.echo, item.row, tools=getattr(item, "tools", None))


def plain_record(line_id: LineId, result: Result, echo: dict | None = None, row: int | None = None,
                 tools: ToolRequest | None = None) -> dict[str, Any]:
    record = {"id": line_id, **({"row": row} if row is not None else {}), **result.to_dict()}
    if tools is not None and not failed(result):
        record.update(result_tool_fields(result, tools))  # text(s), tool_calls, finish_reason(s)
    if result.finish_reason == "timeout" and record["error"] is None:
        record["error"] = {"code": "timeout", "message": "the request's timeout passed before it finished"}
    if result.logprobs is not None:
        record["logprobs"] = result.all_logprobs  # asked for with "logprobs": k; one entry per token id
    if echo is not None:
        record["input"] = echo
    return record


def openai_record(custom_id: LineId, url: str | None, result: Result, model: str,
                  created: int | None = None, responses: ResponsesRequest | None = None,
                  tools: ToolRequest | None = None) -> dict[str, Any]:
    """The OpenAI Batch output line: a chat.completion / text_completion / response body, or an error."""
    record: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id}
    request_id = uuid.uuid4().hex
    if failed(result):
        code = result.error_code or result.finish_reason
        message = result.error or f"the request ended with finish_reason {result.finish_reason!r}"
        status = 400 if code in CLIENT_ERROR_CODES else 408 if code == "timeout" else 500
        record["response"] = {"status_code": status, "request_id": request_id, "body": None}
        record["error"] = {"code": code, "message": message}
        return record
    created = int(time.time()) if created is None else created
    usage = {"prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
             "total_tokens": result.usage.total_tokens,
             "prompt_tokens_details": {"cached_tokens": result.usage.cached_tokens}}
    details = usage_details(result.usage)  # guesses verified, reasoning tokens
    if details is not None:
        usage["completion_tokens_details"] = details
    samples = result.samples if result.samples is not None else [result]
    if url == RESPONSES_URL and responses is not None:
        body = response_object(responses, result, model, created_at=created)
    elif url == CHAT_URL:
        choices = []
        for i, r in enumerate(samples):
            message, finish_reason = chat_message(r.text, r.finish_reason, tools, result.tool_syntax)  # tool calls read out
            choices.append({"index": i, "message": with_reasoning(message, r),
                            "logprobs": None if r.logprobs is None else chat_logprobs(r.logprobs, r.text),
                            "finish_reason": finish_reason})
        body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": created, "model": model,
                "choices": choices, "usage": usage}
    else:
        choices = [{"index": i, "text": r.text,
                    "logprobs": None if r.logprobs is None else completion_logprobs(r.logprobs, r.text),
                    "finish_reason": r.finish_reason} for i, r in enumerate(samples)]
        body = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created, "model": model,
                "choices": choices, "usage": usage}
    record["response"] = {"status_code": 200, "request_id": request_id, "body": body}
    record["error"] = None
    return record


def record_id(record: Any) -> LineId | None:
    """The line id an output record answers (custom_id in the OpenAI shape), for --resume."""
    if not isinstance(record, dict):
        return None
    if "custom_id" in record and "response" in record:
        value = record["custom_id"]
    else:
        value = record.get("id")
    return value if isinstance(value, str) or is_int(value) else None


def is_unnamed_error(record: Any) -> bool:
    """An error record of a line whose id could not be read (its id or custom_id is null)."""
    if not isinstance(record, dict) or not isinstance(record.get("error"), dict):
        return False
    key = "custom_id" if "custom_id" in record and "response" in record else "id"
    return key in record and record[key] is None


def record_error_code(record: dict[str, Any]) -> str | None:
    error = record.get("error")
    return error.get("code") if isinstance(error, dict) else None


def duplicate_id_error(item: LineRequest | LineError) -> LineError:
    """The error for a line whose id an earlier line already used (resume matches lines by id)."""
    return LineError(item.line_no, item.id, "duplicate_id",
                     f"line {item.line_no}: id {json.dumps(item.id)} was already used by an earlier line "
                     "(ids must be unique so --resume can match answers to lines)", item.shape, item.url,
                     item.echo, item.row)
