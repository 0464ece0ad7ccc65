"""POST /v1/responses online; GET / DELETE /v1/responses/{id}, its input_items and cancel.

A response is a chat turn: the body is read as the batch line it would be (online.py, through
openai_format's responses_request.py), then what only the online route serves is added: the
turns of the `previous_response_id` chain go between the instructions and this turn's input,
and a response with `store` (default true) is written to the data dir before its answer (or its
last streamed event) leaves, so a GET or a chain that follows finds it, across restarts too.

The prompt of a stored response is also saved in the engine's disk prefix store
(SamplingParams.store_prefix), as `chat` saves each turn: the next turn's prompt starts with it,
so after a restart its KV is restored rather than evaluated (usage.input_tokens_details.
cached_tokens). Within one process a slot's own cache already gives that.

Every response here is answered in the request that made it (no `background`), so cancel
answers as OpenAI does for such a response: a 400 (a 404 for an id it does not know).
"""
from __future__ import annotations

import logging
from typing import Any, AsyncIterator

from anyio import to_thread

from ...errors import InvalidRequest
from ...openai_format import RESPONSES_URL, build_record, take_online_fields
from ...results import Delta
from .api_errors import ApiError, bad_request
from .limits import MAX_LIST_LIMIT
from .online import Online, OnlineRequest, failure_message
from .response_store import ResponseStore
from .sse import engine_tool_syntax
from .responses_events import ResponseEvents

log = logging.getLogger("llamabatch.serve.http")
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
        request.store = store
        if previous is not None:
            request.history = self.store.history(previous)
        try:
            messages = prepared.item.prompt = request.messages()
        except InvalidRequest as exc:  # a function_call_output that answers no call of the chain
            raise bad_request(str(exc)) from None
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
        shape = ResponseEvents(request, self.online.engine.model_name, engine_tool_syntax(self.online.engine))
        try:
            yield shape.opening()
            while isinstance(event, Delta):
                if event.reasoning:
                    yield shape.reasoning(event.reasoning)
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
        except Exception as exc:  # a bug making its events: the stream still ends, once, with why
            log.exception("a streamed response failed")
            yield shape.failed({"code": "server_error", "message": failure_message(exc)})
        finally:
            handle.cancel()  # a no-op once it ended; stops it when the client went away

    def retrieve(self, response_id: Any) -> dict[str, Any]:
        return self.store.retrieve(response_id)

    def delete(self, response_id: Any) -> dict[str, Any]:
        return self.store.delete(response_id)

    def input_items(self, response_id: Any, *, after: Any, limit: Any, order: Any) -> dict[str, Any]:
        """OpenAI's list of the response's input items: `order` desc (newest first) unless asc,
        `limit` 1 to 100 (20), `after` an item id (an id not among them: an empty page)."""
        if order not in (None, "asc", "desc"):
            raise bad_request("order must be 'asc' or 'desc'", param="order")
        n = 20 if limit is None else int(limit) if isinstance(limit, str) and limit.isdigit() else 0
        if not 1 <= n <= MAX_LIST_LIMIT:
            raise bad_request(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}", param="limit")
        items = self.store.input_items(response_id)
        if order != "asc":
            items = items[::-1]
        if after is not None:
            ids = [item.get("id") for item in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        page = items[:n]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > n}

    def cancel(self, response_id: Any) -> dict[str, Any]:
        self.store.retrieve(response_id)  # a 404 unless it is there
        raise ApiError(400, "Cannot cancel a synchronous response: only responses created with background=true "
                            "can be cancelled, and this server answers every response in its own request.",
                       param="response_id")
