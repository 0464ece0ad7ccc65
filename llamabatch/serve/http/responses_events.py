"""A streamed /v1/responses answer as OpenAI's typed server-sent events, each an `event:` line
naming its type and a `data:` line holding it with its `sequence_number`:

    response.created, response.in_progress          the response, status in_progress, no output
    response.output_item.added                      the assistant message item, empty
    response.content_part.added                     its output_text part, empty
    response.output_text.delta                      one per piece of text
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed                              the whole response (as unstreamed)

A response cut by max_output_tokens ends with `response.incomplete` instead, and one that fails
once the stream has begun with `response.failed` (its `error` says why), as OpenAI's do. No
`data: [DONE]` follows: Responses streams end with their last event.
"""
from __future__ import annotations

import json
import time
from typing import Any

from ...openai_format import (ResponsesRequest, message_item, new_message_id, new_response_id, output_text_part,
                              response_object)
from ...results import Result


class ResponseEvents:
    def __init__(self, request: ResponsesRequest, model: str):
        self.request = request
        self.model = model
        self.response_id = new_response_id()
        self.message_id = new_message_id()
        self.created_at = int(time.time())
        self.sequence = 0
        self.pieces: list[str] = []
        self.final: dict[str, Any] | None = None  # the whole response, once it completed

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return (f"event: {kind}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode("utf-8")
                + b"\n\n")

    def _response(self, result: Result | None, error: dict[str, str] | None = None) -> dict[str, Any]:
        return response_object(self.request, result, self.model, response_id=self.response_id,
                               message_id=self.message_id, created_at=self.created_at, error=error)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": 0, "content_index": 0}

    def opening(self) -> bytes:
        started = self._response(None)
        return (self._event("response.created", response=started)
                + self._event("response.in_progress", response=started)
                + self._event("response.output_item.added", output_index=0,
                              item=message_item(self.message_id, None, "in_progress"))
                + self._event("response.content_part.added", **self._at(), part=output_text_part("")))

    def delta(self, text: str) -> bytes:
        self.pieces.append(text)
        return self._event("response.output_text.delta", **self._at(), delta=text, logprobs=[])

    def ending(self, result: Result) -> bytes:
        """The closing events; the response they carry (`final`) is the one a GET returns."""
        final = self.final = self._response(result)
        item = final["output"][0]
        text = item["content"][0]["text"]
        return (self._event("response.output_text.done", **self._at(), text=text, logprobs=[])
                + self._event("response.content_part.done", **self._at(), part=item["content"][0])
                + self._event("response.output_item.done", output_index=0, item=item)
                + self._event("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                              response=final))

    def failed(self, error: dict[str, Any]) -> bytes:
        """A request that failed after the stream began: the response, failed, with OpenAI's error."""
        return self._event("response.failed", response=self._response(
            None, {"code": error.get("code") or "server_error", "message": error.get("message", "")}))
