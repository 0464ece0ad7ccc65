"""GET /health: whether the server answers requests now, for readiness probes and load balancers.

    200 {"status": "ok"}           the engine serves
    503 {"status": "restarting"}   the isolated engine's process crashed and is being started again
    503 {"status": "error", ...}   the engine can serve nothing more (fatal_error): restart serve

It reads one flag of the engine (EngineAPI.ready) and never waits on it, so a hung or
restarting engine process shows as a 503, never as a probe that hangs. While the model loads,
loading.py answers instead: 503 {"status": "loading"}.
"""
from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

HEALTH_PATH = "/health"


def health_answer(engine: Any) -> JSONResponse:
    if engine.ready:
        return JSONResponse({"status": "ok"})
    fatal = engine.fatal_error
    if fatal is not None:
        return JSONResponse({"status": "error", "message": str(fatal)}, status_code=503)
    return JSONResponse({"status": "restarting"}, status_code=503)
