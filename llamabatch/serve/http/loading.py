"""What the port answers while the model loads: GET /health is 503 {"status": "loading"}, every
other request a 503 in OpenAI's error shape with Retry-After, so a readiness probe or a client
that starts beside `serve` reads "not yet" at once instead of a connection left unanswered.

`serve` binds its socket before the model loads (a port taken is one line, before minutes of
loading). While `open_engine` runs, uvicorn serves this small app from a thread on a duplicate of
that socket; then it stops, and the real app is served on the socket itself. Connections that
arrive in the hand-over wait in the socket's backlog. The API key is asked as on the real app.
"""
from __future__ import annotations

import contextlib
import socket
from typing import Any, Iterator, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .api_errors import ApiError
from .app import front_middleware
from .health import HEALTH_PATH

RETRY_AFTER_S = "1"
_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD"]


async def _loading(request: Request) -> JSONResponse:
    if request.url.path == HEALTH_PATH:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": RETRY_AFTER_S})
    error = ApiError(503, "The model is loading; try again once GET /health answers 200.", code="model_loading")
    return JSONResponse(error.body(), status_code=503, headers={"Retry-After": RETRY_AFTER_S})


def loading_app(api_key: str | None, *, health_without_key: bool = False,
                cors_origins: Sequence[str] = ()) -> Starlette:
    """Every path answers 503 "loading", behind the same key check and CORS as the real app."""
    return Starlette(routes=[Route("/{path:path}", _loading, methods=_METHODS)],
                     middleware=front_middleware(api_key, health_without_key, cors_origins))


@contextlib.contextmanager
def answering_while_loading(sock: socket.socket, app: Any) -> Iterator[None]:
    """Serve `app` on a duplicate of `sock` until the block ends (uvicorn closes the sockets it
    served, so the duplicate keeps `sock` open for the server that follows)."""
    import uvicorn

    from .server import Listening

    spare = sock.dup()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False,
                            timeout_graceful_shutdown=1)  # a loading answer is immediate
    listening = Listening(uvicorn.Server(config), spare)
    thread = listening.run_in_thread()
    try:
        yield
    finally:
        listening.stop()
        thread.join(timeout=10)
        spare.close()
