"""An OpenAI request body read into a prompt and sampling fields: chat and completions bodies,
embeddings inputs, logprobs, response_format and service_tier. Pure functions for lines.py; each raises
InvalidRequest naming the body field, which the line parser makes that line's error record.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from ..params import FIELD_TYPES, MAX_PRIORITY, SamplingParams
from .embed_records import EMBED_BODY_FIELDS, EmbedLine, check_encoding
from .fields import check_messages, check_prompt, is_int
from .ignored_fields import is_accepted
from .tools_request import TOOL_BODY_FIELDS

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
# OpenAI body features not supported: fine when absent or off, an error when asked for.
OFF_BODY_FIELDS = ("stream", "echo", "suffix", *TOOL_BODY_FIELDS)  # tools: chat bodies only (tool_lines.py)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat top_logprobs (and vLLM's default for completions)
# OpenAI's service_tier as a priority step from the line's default (lower runs sooner): "flex"
# below it, "priority" above it; a body's own `priority` (vLLM's field) wins over it.
SERVICE_TIERS = {"auto": 0, "default": 0, "flex": 10, "priority": -10}


def map_body(body: dict[str, Any], url: str) -> tuple[Any, dict[str, Any]]:
    """An OpenAI request body -> (prompt or messages, sampling fields)."""
    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("messages", "prompt", "max_completion_tokens", "response_format", "logprobs", "top_logprobs",
                   "service_tier") or is_accepted(key, url == CHAT_URL):
            continue  # accepted with no effect: ignored_fields.py names them in the record
        if key in TOOL_BODY_FIELDS and url == CHAT_URL:
            continue  # read by tool_lines.py
        if value is None:
            continue  # OpenAI's null means "the default", which the flags supply
        if key in OFF_BODY_FIELDS:
            if value not in (None, False, 0, [], "", "none"):
                raise InvalidRequest(f"body.{key} is not supported")
            continue
        if key == "best_of":
            if value != 1 or isinstance(value, bool):
                raise InvalidRequest(f"body.best_of is not supported (got {json.dumps(value)}): llamabatch "
                                              "does not rank samples; ask for n and get all of them")
            continue
        if key not in FIELD_TYPES:  # vLLM-style extras (top_k, min_p, ignore_eos...) are sampling fields
            raise InvalidRequest(f"unsupported body field {key!r}")
        sampling[key] = value
    if body.get("max_completion_tokens") is not None:
        sampling["max_tokens"] = body["max_completion_tokens"]  # the newer name wins
    logprobs = logprobs_of(body, url)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    schema = response_format_schema(body.get("response_format"))
    if schema is not None:
        sampling["json_schema"] = schema
    if url == CHAT_URL:
        if "messages" not in body:
            raise InvalidRequest(f"{CHAT_URL} needs body.messages")
        return checked_messages(body["messages"]), sampling
    if "prompt" not in body:
        raise InvalidRequest(f"{COMPLETIONS_URL} needs body.prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise InvalidRequest(f"body.prompt must be one prompt, got a list of {len(prompt)}")
        prompt = prompt[0]
    return checked_prompt(prompt), sampling


def embed_body(body: dict[str, Any]) -> EmbedLine:
    """An OpenAI /v1/embeddings body -> what to embed and how to encode it."""
    unknown = [k for k in body if k not in EMBED_BODY_FIELDS]
    if unknown:
        raise InvalidRequest(f"unsupported body field {unknown[0]!r} for {EMBEDDINGS_URL}")
    if "input" not in body:
        raise InvalidRequest(f"{EMBEDDINGS_URL} needs body.input")
    return embed_line(body["input"], body.get("encoding_format"), body.get("dimensions"))


def embed_line(inputs: Any, encoding_format: Any, dimensions: Any) -> EmbedLine:
    """The input is checked by the engine (empty, too many, not strings, out of the vocabulary:
    each this line's error there); the encoding and `dimensions`' type here."""
    try:
        encoding = check_encoding(encoding_format)
    except InvalidRequest as exc:
        raise InvalidRequest(str(exc)) from None
    if dimensions is not None and (not is_int(dimensions) or dimensions <= 0):
        raise InvalidRequest(f"dimensions must be an integer >= 1, got {json.dumps(dimensions)}")
    return EmbedLine(inputs, encoding, dimensions)


def logprobs_of(body: dict[str, Any], url: str) -> int | None:
    """How many alternatives per token the body asks for (None: no logprobs), as OpenAI reads it:
    chat takes `logprobs: true` plus `top_logprobs: 0..20`, completions take `logprobs: k`."""
    value, top = body.get("logprobs"), body.get("top_logprobs")
    if url == CHAT_URL:
        if value is not None and not isinstance(value, bool):
            raise InvalidRequest(f"body.logprobs must be true or false, got {json.dumps(value)}")
        if top is not None and (not is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise InvalidRequest(f"body.top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                                          f"got {json.dumps(top)}")
        if top and not value:
            raise InvalidRequest("body.top_logprobs needs body.logprobs set to true")
        return (top or 0) if value else None
    if top is not None:
        raise InvalidRequest(f"{COMPLETIONS_URL} takes body.logprobs (an integer), not body.top_logprobs")
    if value is None:
        return None
    if not is_int(value) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"body.logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                                      f"got {json.dumps(value)}")
    return value


def response_format_schema(value: Any) -> dict | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("response_format.json_schema.schema must be a JSON schema object")
        return schema
    raise InvalidRequest("response_format.type must be text, json_object or json_schema")


def checked_prompt(prompt: Any) -> str | list[int]:
    return check_prompt(prompt)


def checked_messages(messages: Any) -> list[dict]:
    messages = check_messages(messages)
    # OpenAI's newer name for the system role; chat templates know only "system".
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


def with_tier(sampling: dict[str, Any], tier: Any, defaults: SamplingParams) -> dict[str, Any]:
    """`sampling` with the priority a body's service_tier asks for (none when it gives `priority`)."""
    if tier is None:
        return sampling
    if not isinstance(tier, str) or tier not in SERVICE_TIERS:
        raise InvalidRequest(f"body.service_tier must be one of {', '.join(map(json.dumps, SERVICE_TIERS))}, "
                             f"got {json.dumps(tier)}")
    if "priority" in sampling:
        return sampling
    return {**sampling, "priority": max(-MAX_PRIORITY, min(MAX_PRIORITY, defaults.priority + SERVICE_TIERS[tier]))}
