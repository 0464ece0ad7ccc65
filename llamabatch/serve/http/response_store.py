"""Stored responses (`store`, default true) in the data dir, one JSON file each:

    DIR/responses/<resp-id>.json   {"response": the response object, "input": this turn's
                                    chat turns, "items": the same input as OpenAI lists it,
                                    "previous_response_id": the one it continued}

A file is written to a temporary name, fsynced and renamed (files/replaced_file.py), so after
a kill -9 a response is there whole or not at all; temporary files a kill left are removed at
the next start. A file holds its own turn only: `history` walks previous_response_id links back
and joins the turns, so a response deleted mid-chain breaks exactly the chains through it.
Ids are checked against the shape this server makes before they name a path.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

from ...files.replaced_file import replacing, sync_folder
from ...openai_format import ResponsesRequest, assistant_turn
from .api_errors import ApiError, not_found
from .object_ids import shown

_ID = re.compile(r"resp_[0-9a-f]{48}")
# A chain longer than this is refused (each link is a file read per request); the text the
# model is asked to continue is bounded by its context anyway.
MAX_CHAIN = 1000
MAX_CHAIN_BYTES = 16 * 1024 * 1024


class ResponseStore:
    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for name in os.listdir(folder):  # a save a kill cut short: never renamed, never named
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, name))

    def _path(self, response_id: str) -> str:
        return os.path.join(self.folder, f"{response_id}.json")

    def save(self, request: ResponsesRequest, response: dict[str, Any]) -> None:
        """Keep a finished response with this turn's input (blocking: fsyncs; run it off the loop)."""
        response_id = response["id"]
        assert _ID.fullmatch(response_id), response_id
        data = json.dumps({"response": response, "input": request.input, "items": request.items,
                           "previous_response_id": request.previous_response_id}, ensure_ascii=False).encode()
        with replacing(self._path(response_id)) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_folder(self.folder)

    def _load(self, raw_id: Any) -> dict[str, Any] | None:
        if not (isinstance(raw_id, str) and _ID.fullmatch(raw_id)):
            return None
        try:
            with open(self._path(raw_id), "rb") as f:
                stored = json.loads(f.read())
        except (OSError, ValueError):  # gone (deleted), or not a file this server wrote whole
            return None
        return stored if _well_formed(stored) else None  # edited by hand: as good as gone

    def retrieve(self, raw_id: Any) -> dict[str, Any]:
        stored = self._load(raw_id)
        if stored is None:
            raise not_found("response", shown(raw_id))
        return stored["response"]

    def input_items(self, raw_id: Any) -> list[dict[str, Any]]:
        """The response's input items, oldest first (a file saved before items were kept: its
        messages, each as the message item it was)."""
        stored = self._load(raw_id)
        if stored is None:
            raise not_found("response", shown(raw_id))
        if isinstance(stored.get("items"), list):
            return stored["items"]
        return [{"id": f"msg_{raw_id[5:]}{i}", "type": "message", "role": m["role"], "status": "completed",
                 "content": [{"type": "output_text" if m["role"] == "assistant" else "input_text", "text": m["content"]}]}
                for i, m in enumerate(stored["input"])]

    def delete(self, raw_id: Any) -> dict[str, Any]:
        self.retrieve(raw_id)  # a 404 unless it is there
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(raw_id))
        sync_folder(self.folder)
        return {"id": raw_id, "object": "response", "deleted": True}

    def history(self, previous_id: str) -> list[dict[str, Any]]:
        """The turns of the chain ending at `previous_id`, oldest first: each stored response's
        input turns and its answer as the assistant's turn (its calls as tool_calls)."""
        turns: list[list[dict[str, str]]] = []
        size, wanted, continued = 0, previous_id, None
        while wanted is not None:
            if len(turns) >= MAX_CHAIN:
                raise _chain_error(f"the chain of previous responses is longer than {MAX_CHAIN} responses; "
                                   "start a new one with the conversation as input items")
            stored = self._load(wanted)
            if stored is None:
                raise _missing(wanted, continued)
            turn = [*stored["input"], assistant_turn(stored["response"])]
            size += sum(len(m["content"]) for m in turn)
            if size > MAX_CHAIN_BYTES:
                raise _chain_error(f"the chain of previous responses holds more than {MAX_CHAIN_BYTES // 2**20} MiB "
                                   "of text; start a new one with the conversation as input items")
            turns.append(turn)
            continued, wanted = wanted, stored.get("previous_response_id")
        return [message for turn in reversed(turns) for message in turn]


def _well_formed(stored: Any) -> bool:
    return (isinstance(stored, dict) and isinstance(stored.get("response"), dict)
            and isinstance(stored.get("input"), list)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in stored["input"])
            and isinstance(stored.get("previous_response_id"), (str, type(None))))


def _missing(wanted: str, continued: str | None) -> ApiError:
    message = f"Previous response with id '{shown(wanted)}' not found."
    if continued is not None:  # deleted mid-chain: only chains through it break
        message += f" It was deleted, and response '{continued}' in this chain continues it."
    return ApiError(404, message, param="previous_response_id", code="previous_response_not_found")


def _chain_error(message: str) -> ApiError:
    return ApiError(400, message, param="previous_response_id")
