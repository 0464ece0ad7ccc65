"""POST /v1/responses online, and GET / DELETE /v1/responses/{id}.

A response is a chat turn: the body is read as the batch line it would be (online.py, through
openai_format's responses_request.py), then what only the online route serves is added: the
turns of the `previous_response_id` chain go between the instructions and this turn's input,
and a response with `store` (default true) is written to the data dir before its answer (or its
last streamed event) leaves, so a GET or a chain that follows finds it, across restarts too.

The prompt of a stored response is also saved in the engine's disk prefix store
(SamplingParams.store_prefix), as `chat` saves each turn: the next turn's prompt starts with it,
so after a restart its KV is restored rather than evaluated (usage.input_tokens_details.
cached_tokens). Within one process a slot's own cache already gives that.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from anyio import to_thread

from ...errors import InvalidRequest
from ...openai_format import RESPONSES_URL, build_record, take_online_fields
from ...results import Delta
from .api_errors import bad_request
from .online import Online, OnlineRequest
from .response_store import ResponseStore
from .responses_events import ResponseEvents

# A prompt shorter than this many characters is shorter than the fewest tokens the prefix store
# restores (128), so saving it would cost a snapshot and a file for nothing.
MIN_SAVED_CHARS = 128


class ResponsesOnline:
    def __init__(self, online: Online, store: ResponseStore):
        self.online = online
        self.store = store

    def prepare(self, body: Any) -> OnlineRequest:
        """The request, with its chain's turns read from disk (blocking: run it off the loop)."""
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        body = dict(body)
        try:
            store, previous = take_online_fields(body)
        except InvalidRequest as exc:
            raise bad_request(str(exc)) from None
        prepared = self.online.prepare(RESPONSES_URL, body)
        request = prepared.item.responses
        assert request is not None
        request.store, request.previous_response_id = store, previous
        if previous is not None:
            request.history = self.store.history(previous)
        messages = prepared.item.prompt = request.messages()
        if store and sum(len(m["content"]) for m in messages) >= MIN_SAVED_CHARS:
            prepared.item.params = prepared.item.params.replace(store_prefix=True)
        return prepared

    async def answer(self, prepared: OnlineRequest) -> dict[str, Any]:
        response = await self.online.answer(prepared)
        request = prepared.item.responses
        if request is not None and request.store:
            await to_thread.run_sync(self.store.save, request, response)
        return response

    async def open_stream(self, prepared: OnlineRequest) -> AsyncIterator[bytes]:
        return await self.online.open_stream(prepared, self._events)

    async def _events(self, prepared: OnlineRequest, handle: Any, events: Any, event: Any) -> AsyncIterator[bytes]:
        request = prepared.item.responses
        assert request is not None
        shape = ResponseEvents(request, self.online.engine.model_name)
        try:
            yield shape.opening()
            while isinstance(event, Delta):
                if event.text:
                    yield shape.delta(event.text)
                event = await events.get()
            record = build_record(prepared.item, event, self.online.engine.model_name)
            if record["error"] is not None:  # it failed after the stream began
                yield shape.failed(record["error"])
                return
            ending = shape.ending(event)
            if request.store:
                await to_thread.run_sync(self.store.save, request, shape.final)
            yield ending
        finally:
            handle.cancel()  # a no-op once it ended; stops it when the client went away

    def retrieve(self, response_id: Any) -> dict[str, Any]:
        return self.store.retrieve(response_id)

    def delete(self, response_id: Any) -> dict[str, Any]:
        return self.store.delete(response_id)
