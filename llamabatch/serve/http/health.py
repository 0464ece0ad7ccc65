"""GET /health: whether the server answers requests now, for readiness probes and load balancers.

    200 {"status": "ok"}           the engine serves
    503 {"status": "restarting"}   the isolated engine's process crashed and is being started again
    503 {"status": "error", ...}   the engine can serve nothing more (fatal_error): restart serve

It reads one flag of the engine (EngineAPI.ready) and never waits on it, so a hung or
restarting engine process shows as a 503, never as a probe that hangs. While the model loads,
loading.py answers instead: 503 {"status": "loading"}. On Ray workers (serve --ray) the
answer also lists each worker ("workers": name, node, pid, state, slots, inflight, lines, ...).
"""
from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

HEALTH_PATH = "/health"


def health_answer(engine: Any) -> JSONResponse:
    # serve --ray: each worker's state and load beside the whole's (ok while one worker serves)
    rows = getattr(engine, "worker_rows", None)
    workers = {"workers": rows()} if rows is not None else {}
    if engine.ready:
        return JSONResponse({"status": "ok", **workers})
    fatal = engine.fatal_error
    if fatal is not None:
        return JSONResponse({"status": "error", "message": str(fatal), **workers}, status_code=503)
    return JSONResponse({"status": "restarting", **workers}, status_code=503)
