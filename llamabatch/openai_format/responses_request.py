"""OpenAI's /v1/responses request body read as one chat turn, for `serve` (online and batch
lines) and `run` files alike: `input` (a string or items: responses_input.py), `instructions`,
`max_output_tokens`, `temperature`, `top_p`, `text.format`, `metadata`, `store`,
`previous_response_id`, function `tools` (responses_tools.py) and `reasoning` (its `effort` reaches
the chat template as chat's reasoning_effort does; a `summary` asked for is echoed, and the
reasoning item's summary stays empty: no summary is written here), plus llamabatch's own sampling
fields as chat bodies take them.

What a response cannot be made from here (images, files, computer calls, tools other than
functions) is refused naming the item, part or type. Pure: no I/O. A chain of stored responses (previous_response_id) is read by the
server, which hands its turns in as `history`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from ..params import FIELD_TYPES, REASONING_EFFORTS
from .fields import is_int, json_kind
from .responses_input import call_ids_check, read_input, short_json
from .responses_tools import parse_responses_tools
from .tool_lines import call_grammar
from .tool_turns import tool_turns
from .tools_request import ToolRequest, tools_message

RESPONSES_URL = "/v1/responses"
# Read here, not sampling fields (service_tier is read by lines.py as for chat bodies).
OWN_FIELDS = ("input", "instructions", "max_output_tokens", "text", "metadata", "store", "previous_response_id",
              "stream", "service_tier", "tools", "tool_choice", "parallel_tool_calls", "reasoning")
# Accepted and ignored: the loaded model answers, and these change nothing it does.
IGNORED_FIELDS = ("model", "user", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
                  "stream_options", "truncation")
# Features not served: fine when absent or off, refused when asked for.
OFF_FIELDS = ("include", "background", "top_logprobs", "max_tool_calls", "prompt", "conversation")
OFF_VALUES = (None, False, 0, [], {}, "", "none", "auto")
# Sampling fields a response has no use for: one output, no logprobs (no `include` of them).
NOT_SAMPLING = ("n", "logprobs", "best_of")
REASONING_SUMMARIES = ("auto", "concise", "detailed")  # OpenAI's reasoning.summary values
VERBOSITIES = ("low", "medium", "high")  # OpenAI's text.verbosity values
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's


@dataclass
class ResponsesRequest:
    """One /v1/responses body, checked. `input` holds this turn's chat turns only ({"role",
    "content"} with text content; tool turns in chat's shape), which is what a stored response
    keeps for its chain; `items` the same input as OpenAI lists it (input_items)."""

    input: list[dict[str, Any]]
    instructions: str | None
    sampling: dict[str, Any]  # SamplingParams fields (max_output_tokens read as max_tokens)
    text_format: dict[str, Any]  # echoed in the response's `text.format`
    metadata: dict[str, str]
    store: bool
    previous_response_id: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)  # the chain's turns, oldest first
    params: Any = None  # the SamplingParams it runs with (defaults filled in): the response echoes them
    items: list[dict[str, Any]] = field(default_factory=list)
    tools: ToolRequest | None = None
    tool_choice: Any = None  # as given, for the response's echo when no tools are listed
    reasoning: dict[str, Any] = field(default_factory=lambda: {"effort": None, "summary": None})  # echoed

    def messages(self) -> list[dict[str, Any]]:
        """The chat the model is asked to continue: the tools for the template (when calls are
        allowed), instructions as the system message (this response's own: OpenAI does not carry
        a previous response's instructions over), then the chain's turns, then this turn's input,
        tool turns in the template's shape. developer is OpenAI's newer name for system.
        InvalidRequest when a function_call_output answers no call before it."""
        head = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if self.previous_response_id is not None and not self.history:  # the chain is read after the body
            return head + self.input  # (serve's online route): checked once it is there
        call_ids_check(self.history, self.items)
        chat = tool_turns([{**m, "role": "system"} if m["role"] == "developer" else m
                           for m in head + self.history + self.input])
        return [tools_message(self.tools), *chat] if self.tools is not None and self.tools.calls_allowed else chat


def parse_responses_body(body: dict[str, Any]) -> ResponsesRequest:
    """A body as a batch line reads it (`serve`'s online route reads the same, after taking
    out what only it serves: take_online_fields). Raises InvalidRequest naming the field at
    fault. A batch line is never stored, and cannot continue a stored response."""
    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if key in OWN_FIELDS or key in IGNORED_FIELDS or value is None:
            continue
        if key in OFF_FIELDS:
            if not _off(value):
                raise InvalidRequest(f"body.{key} is not supported by this server (got {short_json(value)})")
            continue
        if key in NOT_SAMPLING or key not in FIELD_TYPES:
            raise InvalidRequest(f"unsupported body field {key!r} for {RESPONSES_URL}")
        sampling[key] = value
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not is_int(limit) or limit < 1:
            raise InvalidRequest(f"body.max_output_tokens must be an integer >= 1, got {short_json(limit)}")
        sampling["max_tokens"] = limit
    if body.get("stream"):
        raise InvalidRequest("body.stream is not supported in a batch line: a batch writes whole responses")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, ChainedId):
        raise InvalidRequest("body.previous_response_id is not supported in batch lines: send the whole "
                             "conversation as input items")
    _store(body.get("store"))  # checked, then ignored: a batch's responses are in its output file
    reasoning = _reasoning(body.get("reasoning"), sampling)
    text_format, schema = _text_format(body.get("text"))
    if schema is not None:
        sampling["json_schema"] = schema
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest(f"body.instructions must be a string, got {json_kind(instructions)}")
    if body.get("input") is None:
        raise InvalidRequest(f"{RESPONSES_URL} needs body.input")
    turns, items = read_input(body["input"])
    tools = parse_responses_tools(body)
    if tools is not None and tools.calls_allowed:
        if schema is not None:
            raise InvalidRequest("body.tools constrain the answer to function calls and cannot be combined with "
                                 "text.format json_schema or json_object (with tool_choice none they can)")
        if sampling.get("grammar"):
            raise InvalidRequest("body.tools constrain the answer to function calls and cannot be combined with "
                                 "grammar (with tool_choice none they can)")
        sampling["grammar"] = call_grammar(tools)
    return ResponsesRequest(turns, instructions or None, sampling, text_format, _metadata(body.get("metadata")),
                            store=False, items=items, tools=tools, tool_choice=body.get("tool_choice"),
                            reasoning=reasoning,
                            previous_response_id=None if previous is None else str(previous))


class ChainedId(str):
    """A previous_response_id the online route checked and will read the chain of: a batch line
    (parsed from JSON) never holds one, so its previous_response_id is refused."""


def take_online_fields(body: dict[str, Any]) -> tuple[bool, str | None]:
    """Take `store` (default true, as OpenAI) out of an online body and mark its
    `previous_response_id`, checked: what the server serves online only, around the batch
    line's reading."""
    store = _store(body.pop("store", None))
    previous = body.pop("previous_response_id", None)
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest(f"body.previous_response_id must be a string, got {json_kind(previous)}")
    if previous is not None:
        body["previous_response_id"] = ChainedId(previous)
    return store, previous


def _store(value: Any) -> bool:
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"body.store must be true or false, got {json_kind(value)}")
    return value is not False


def _reasoning(value: Any, sampling: dict[str, Any]) -> dict[str, Any]:
    """The `reasoning` object, checked, as the response echoes it; its effort joins `sampling` as
    reasoning_effort (one given at the top level too must agree)."""
    if value is None:
        return {"effort": None, "summary": None}
    if not isinstance(value, dict):
        raise InvalidRequest(f"body.reasoning must be an object, got {json_kind(value)}")
    unknown = [k for k in value if k not in ("effort", "summary", "generate_summary")]
    if unknown:
        raise InvalidRequest(f"unsupported field reasoning.{unknown[0]}")
    effort = value.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise InvalidRequest(f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}, got {short_json(effort)}")
    for name in ("generate_summary", "summary"):  # generate_summary: the older name, each checked
        if value.get(name) is not None and value[name] not in REASONING_SUMMARIES:
            raise InvalidRequest(f"reasoning.{name} must be one of {', '.join(REASONING_SUMMARIES)}, "
                                 f"got {short_json(value[name])}")
    summary = value.get("summary") or value.get("generate_summary")
    if effort is not None:
        if sampling.get("reasoning_effort", effort) != effort:
            raise InvalidRequest(f"body.reasoning_effort {short_json(sampling['reasoning_effort'])} and "
                                 f"reasoning.effort {short_json(effort)} disagree: give one")
        sampling["reasoning_effort"] = effort
    return {"effort": effort, "summary": summary}


def _text_format(value: Any) -> tuple[dict[str, Any], dict | None]:
    """(the `format` the response echoes, the JSON schema its output must follow or None)."""
    if value is None:
        return {"type": "text"}, None
    if not isinstance(value, dict):
        raise InvalidRequest(f"body.text must be an object, got {json_kind(value)}")
    unknown = [k for k in value if k not in ("format", "verbosity")]
    if unknown:
        raise InvalidRequest(f"unsupported field text.{unknown[0]}")
    verbosity = value.get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITIES:  # accepted and ignored: the model says what it says
        raise InvalidRequest(f"text.verbosity must be one of {', '.join(VERBOSITIES)}, got {short_json(verbosity)}")
    spec = value.get("format")
    if spec is None:
        return {"type": "text"}, None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "text":
        return {"type": "text"}, None
    if kind == "json_object":
        return {"type": "json_object"}, {"type": "object"}
    if kind == "json_schema":
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest("text.format.schema must be a JSON schema object")
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidRequest(f"text.format.name must be a string, got {json_kind(name)}")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest(f"text.format.strict must be true or false, got {json_kind(strict)}")
        echoed = {"type": "json_schema", "name": name or "response", "schema": schema, "strict": strict}
        if isinstance(spec.get("description"), str):
            echoed["description"] = spec["description"]
        return echoed, schema  # the schema masks every token, as chat's response_format does
    raise InvalidRequest("text.format.type must be text, json_object or json_schema")


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA_PAIRS or not all(
            isinstance(v, str) and len(v) <= MAX_METADATA_VALUE and len(k) <= MAX_METADATA_KEY
            for k, v in value.items()):
        raise InvalidRequest(f"body.metadata must be an object of at most {MAX_METADATA_PAIRS} pairs, keys of at "
                             f"most {MAX_METADATA_KEY} characters and string values of at most "
                             f"{MAX_METADATA_VALUE}")
    return dict(value)


def _off(value: Any) -> bool:
    """A feature left off: an off value, or an object of them."""
    if isinstance(value, dict):
        return all(v in OFF_VALUES for v in value.values())
    return value in OFF_VALUES
