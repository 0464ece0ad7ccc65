"""The online endpoints: one request body -> one engine request, answered in OpenAI's shape.

A body is read by the same line parser a batch line goes through (openai_format/lines.py:
the same fields, checks and errors), as the batch line {"custom_id", "url", "body"} it would be;
`stream` and `stream_options` are the only fields read here. The answer is the `body` of the
record a batch would have written for that line, so online and batch answers have one shape.
Waiting never blocks the event loop: the engine's callback hands results to it.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ...api import EngineAPI
from ...errors import EngineClosed, LlamaBatchError, QueueFull
from ...openai_format import CHAT_URL, EMBEDDINGS_URL, LineError, LineParser, LineRequest, build_record
from ...params import MAX_PRIORITY
from ...results import Delta
from .api_errors import ApiError, bad_request
from .sse import DONE, StreamShape, engine_tool_syntax

log = logging.getLogger("llamabatch.serve.http")

_LINE_PREFIX = re.compile(r"^line 1(: | )")


def online_defaults(defaults: Any) -> Any:
    """An online request's defaults: the engine's, one priority step above a batch line's (a
    lower number), so it goes first; a body's own `priority` or `service_tier` says otherwise."""
    return defaults.replace(priority=max(defaults.priority - 1, -MAX_PRIORITY))


@dataclass
class OnlineRequest:
    item: LineRequest
    stream: bool
    include_usage: bool


class Online:
    """`running`: online requests submitted and not yet ended (the batch lane leaves them slots);
    `on_end()` is called, on the engine's thread, whenever one ends; `on_result(url, result)`
    too, with its terminal Result, or None when it was refused before it reached the engine
    (/metrics counts them)."""

    def __init__(self, engine: EngineAPI, on_end: Callable[[], None] = lambda: None):
        self.engine = engine
        self.on_end = on_end
        self.on_result: Callable[[str, Any], None] = lambda url, result: None
        self.running = 0
        self._lock = threading.Lock()

    def prepare(self, url: str, body: Any) -> OnlineRequest:
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        body = dict(body)
        stream = body.pop("stream", None) or False
        options = body.pop("stream_options", None)
        if not isinstance(stream, bool):
            raise bad_request("stream must be true or false", param="stream")
        if stream and url == EMBEDDINGS_URL:
            raise bad_request(f"{EMBEDDINGS_URL} does not stream", param="stream")
        if stream and body.get("logprobs"):
            raise bad_request("logprobs are not streamed: ask without stream", param="logprobs")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        line = {"custom_id": "online", "method": "POST", "url": url, "body": body}  # the body is checked (app.py)
        item = LineParser(online_defaults(self.engine.default_params), input_format="jsonl").parse_object(line, 1)
        if isinstance(item, LineError) or item is None:
            message = _LINE_PREFIX.sub("", item.message) if item is not None else "empty request"
            raise bad_request(message, code=item.code if item is not None else None)
        return OnlineRequest(item, stream, include_usage)

    async def answer(self, request: OnlineRequest) -> dict[str, Any]:
        """The whole response body of a request that does not stream."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def on_event(_handle: Any, event: Any) -> None:
            if not isinstance(event, Delta):
                loop.call_soon_threadsafe(_settle, done, event)

        item = request.item
        handle = self._submit(item, on_event, stream=False)
        try:
            result = await done
        finally:
            handle.cancel()  # a no-op once it ended; stops it when the caller went away
        record = build_record(item, result, self.engine.model_name)
        if record["error"] is not None:
            raise _failed(record)
        return record["response"]["body"]

    async def open_stream(self, request: OnlineRequest, render: Callable[..., AsyncIterator[bytes]] | None = None
                          ) -> AsyncIterator[bytes]:
        """Server-sent events: the deltas as chunks, the finish reasons, usage if asked, [DONE];
        or what `render(request, handle, events, first)` makes of them (/v1/responses' events).

        Returns once the engine has said its first word on the request, so a request it refuses
        (a schema that does not compile, a prompt past the context) raises ApiError here with
        the status it gets unstreamed, before a 200 and its headers are sent."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        handle = self._submit(request.item,
                              lambda _h, event: loop.call_soon_threadsafe(events.put_nowait, event), stream=True)
        try:
            first = await events.get()
            if not isinstance(first, Delta):
                record = build_record(request.item, first, self.engine.model_name)
                if record["error"] is not None:
                    raise _failed(record)
        except BaseException:
            handle.cancel()  # a no-op once it ended; stops it when the caller went away
            raise
        return (render or self._events)(request, handle, events, first)

    async def _events(self, request: OnlineRequest, handle: Any, events: asyncio.Queue,
                      event: Any) -> AsyncIterator[bytes]:
        shape = StreamShape(request.item.url or CHAT_URL, self.engine.model_name, max(1, request.item.params.n),
                            tools=request.item.tools, tool_syntax=engine_tool_syntax(self.engine))
        try:
            opening = shape.opening()
            if opening:
                yield opening
            while isinstance(event, Delta):
                if event.text or event.reasoning:
                    chunk = shape.delta(event)
                    if chunk:  # a tool call's text is held until the call closes
                        yield chunk
                event = await events.get()
            record = build_record(request.item, event, self.engine.model_name)
            if record["error"] is not None:  # it failed after its first token
                yield shape.error(_failed(record).body())
            else:
                yield shape.ending(event, request.include_usage)
            yield DONE
        except Exception as exc:  # a bug making its chunks: the stream still ends, once, with why
            log.exception("a streamed answer failed")
            yield shape.error(ApiError(500, failure_message(exc)).body()) + DONE
        finally:
            handle.cancel()

    def _submit(self, item: LineRequest, callback: Any, *, stream: bool) -> Any:
        def counted(handle: Any, event: Any) -> None:
            if not isinstance(event, Delta):
                self._ended()
                self.on_result(item.url or CHAT_URL, event)
            callback(handle, event)

        with self._lock:
            self.running += 1
        try:
            if item.embed is not None:
                return self.engine.submit_embedding(item.embed.inputs, dimensions=item.embed.dimensions,
                                                    callback=counted)
            return self.engine.submit(item.prompt, item.params, stream=stream, callback=counted)
        except LlamaBatchError as exc:  # refused before it was queued: it never ends on its own
            self._ended()
            self.on_result(item.url or CHAT_URL, None)
            if isinstance(exc, QueueFull):
                raise ApiError(429, str(exc), code="queue_full") from None
            if isinstance(exc, EngineClosed):
                raise ApiError(503, str(exc), code="engine_closed") from None
            raise bad_request(str(exc), code=exc.code) from None

    def _ended(self) -> None:
        with self._lock:
            self.running -= 1
        self.on_end()


def failure_message(exc: BaseException) -> str:
    """What a request that failed in the server is told (as app.py's 500s tell it)."""
    return f"the server failed to answer: {type(exc).__name__}: {exc}"


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _failed(record: dict[str, Any]) -> ApiError:
    """The error of a record that failed, with the status a batch record gives it."""
    status = record["response"]["status_code"]
    return ApiError(status, record["error"]["message"], code=record["error"]["code"])
