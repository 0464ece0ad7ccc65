"""Ray's errors, said short for `run --ray`'s notes and records, and the error the pool's
start raises."""
from __future__ import annotations

from ray.exceptions import ActorUnavailableError

from ..errors import ClusterStartError


class RayStartError(ClusterStartError):
    """Ray can't be reached, the cluster can't hold the engines, or a worker can't load the model."""

    code = "ray_start_error"


def death(exc: BaseException) -> str:
    """Why a worker's call failed, short: Ray's own text is a paragraph with ids."""
    if isinstance(exc, ActorUnavailableError):
        return "its process died or can't be reached (ActorUnavailableError)"
    return first_line(exc)[:200]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Ray's errors carry tracebacks; the last "SomeError: message" line says what happened.
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and ("Error" in line.split(":")[0] or "Exception" in line.split(":")[0]):
            return line[:300]
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
