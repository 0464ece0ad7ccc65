"""Waiting for the engine on behalf of a client that may leave.

Starlette does not cancel a handler when its client disconnects: a handler awaiting an engine
result would keep the request generating for nobody, holding a slot the next client waits for
(an SDK's timeout and retry piles them up). So the wait watches the connection too, and a
client that leaves first cancels it; the awaited coroutine's own cleanup (its `finally`)
cancels the engine request.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import ClientDisconnect, Request

T = TypeVar("T")


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`await work`, unless the client disconnects first: then `work` is cancelled (and has
    ended when this returns) and ClientDisconnect is raised. Call once the body has been read."""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is itself cancelled (the server shutting down)
        gone.cancel()
        job.cancel()  # nothing once it has finished
    if job.done() and not job.cancelled():
        return job.result()
    await asyncio.wait((job,))  # let its cleanup run: the engine request is cancelled before we answer
    raise ClientDisconnect()


async def _disconnected(request: Request) -> None:
    # With the body read, the server's next message is http.disconnect, sent when the client
    # closes the connection (uvicorn holds it back until then)
    while (await request.receive())["type"] != "http.disconnect":
        pass
