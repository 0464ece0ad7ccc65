"""`llamabatch serve-stdin`: a JSONL co-process. The protocol is in llamabatch/protocol.py,
the threads in serve_loop.py; this module is the command line around them."""
from __future__ import annotations

import os
from enum import Enum
from typing import Annotated

import typer

from .app import app
from .common import cli_errors, open_engine, resolve_options
from .options import SharedOptions, with_shared_options


class OnEof(str, Enum):
    drain = "drain"
    cancel = "cancel"


@app.command("serve-stdin")
@with_shared_options
def serve_stdin(
    max_queue: Annotated[int, typer.Option("--max-queue", min=0, help="Most requests waiting for a slot; "
                                           "one more gets an error event with code queue_full. 0 = no limit.")] = 0,
    on_eof: Annotated[OnEof, typer.Option("--on-eof", help="At end of input: drain = finish what is in flight, "
                                          "cancel = cancel it.")] = OnEof.drain,
    *,
    opts: SharedOptions,
) -> None:
    """Read JSON-line requests from stdin as they arrive, run them concurrently, write JSON-line events.

    Request: {"id": "a1", "prompt": "..."} or {"id": "a1", "messages": [...]}, plus any sampling
    field and "stream": true for token events. Control: {"op": "cancel", "id": "a1"}, {"op": "stats"}.
    Events: ready, token, done, error, stats; one JSON object per line, flushed per line.
    """
    from .serve_loop import serve

    resolved = resolve_options(opts)
    with cli_errors():
        config = resolved.engine.replace(max_queue=max_queue).validate()
        resolved.engine = config
        # The protocol owns stdout. Keep a private copy of it for events and point fd 1 at
        # stderr, so nothing else (a stray print, a C library's printf) can corrupt the stream.
        events_fd = os.dup(1)
        os.dup2(2, 1)
        engine = open_engine(resolved)
        code = serve(engine, 0, events_fd, on_eof.value)
        os.close(events_fd)
    raise typer.Exit(code)
