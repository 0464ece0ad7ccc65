"""POST /tokenize and POST /detokenize in llama-server's shapes, over the engine's vocabulary, and
POST /v1/responses/input_tokens in OpenAI's.

    /tokenize    {"content": str, "add_special": false, "parse_special": true, "with_pieces": false}
                 -> {"tokens": [id, ...]}, or with pieces {"tokens": [{"id": id, "piece": str | [byte, ...]}]}
    /detokenize  {"tokens": [id, ...]} -> {"content": str}

A piece is a string when its bytes are UTF-8, else the list of its byte values (a token that
holds part of a character), as llama-server gives it. The engine call runs in a worker thread:
an isolated engine answers from its child process, which may be busy or restarting.
"""
from __future__ import annotations

from typing import Any

from anyio import to_thread

from ...api import EngineAPI
from ...errors import EngineClosed, InvalidRequest, LlamaBatchError
from .api_errors import ApiError, bad_request

# Characters one /tokenize may send: llama.cpp's tokenizer is about quadratic on long runs of
# spaces (640k took 3.6 s), and an isolated engine's child answers nothing else meanwhile.
MAX_TOKENIZE_CHARS = 1 << 20


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false", param=name)
    return value


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


async def tokenize(engine: EngineAPI, body: Any) -> dict[str, Any]:
    body = _object(body)
    content = body.get("content")
    if not isinstance(content, str):
        raise bad_request(f"content must be a string, got {_kind(content)}", param="content")
    if len(content) > MAX_TOKENIZE_CHARS:
        raise bad_request(f"content has {len(content)} characters; at most {MAX_TOKENIZE_CHARS} a request",
                          param="content")
    add_special = _flag(body, "add_special", False)
    parse_special = _flag(body, "parse_special", True)
    with_pieces = _flag(body, "with_pieces", False)

    def work() -> dict[str, Any]:
        tokens = engine.tokenize(content, special=parse_special, add_special=add_special)
        if not with_pieces:
            return {"tokens": tokens}
        pieces = engine.token_pieces(tokens)
        return {"tokens": [{"id": t, "piece": _piece(p)} for t, p in zip(tokens, pieces)]}
    return await _engine_call(work)


async def detokenize(engine: EngineAPI, body: Any) -> dict[str, Any]:
    tokens = _object(body).get("tokens")
    if not isinstance(tokens, list):
        raise bad_request(f"tokens must be a list of token ids, got {_kind(tokens)}", param="tokens")

    def work() -> dict[str, Any]:
        return {"content": b"".join(engine.token_pieces(tokens)).decode("utf-8", "replace")}
    return await _engine_call(work)


async def count_input_tokens(engine: EngineAPI, prepare: Any, body: Any) -> dict[str, Any]:
    """POST /v1/responses/input_tokens: the tokens a Responses body's input takes, as the engine
    would evaluate it (the chain of `previous_response_id`, instructions and tools included).
    `prepare` reads the body as /v1/responses does, so a body it refuses is refused here alike."""
    def work() -> dict[str, Any]:
        prompt = prepare(body).item.prompt
        return {"object": "response.input_tokens",
                "input_tokens": len(engine.tokenize(engine.render_chat(prompt), special=True))}
    return await _engine_call(work)


def _piece(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:  # part of a character: its bytes, as llama-server
        return list(piece)


async def _engine_call(work: Any) -> dict[str, Any]:
    """`work()` in a thread, its engine errors as the statuses a caller can act on."""
    try:
        return await to_thread.run_sync(work)
    except ApiError:  # already an answer (a Responses body refused, an unknown previous_response_id)
        raise
    except InvalidRequest as exc:
        raise bad_request(str(exc), code=exc.code) from None
    except EngineClosed as exc:
        raise ApiError(503, f"the engine cannot answer now: {exc}", code="engine_unavailable") from None
    except TimeoutError as exc:
        raise ApiError(503, f"the engine did not answer: {exc}", code="engine_unavailable") from None
    except LlamaBatchError as exc:
        raise bad_request(str(exc), code=exc.code) from None


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
