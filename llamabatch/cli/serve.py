"""`llamabatch serve-stdin`: a JSONL co-process. The protocol is in llamabatch/protocol.py,
the threads in serve_loop.py; this module is the command line around them."""
from __future__ import annotations

import os
from enum import Enum

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
    # Default-value style, not Annotated: with_shared_options hands Typer a signature whose
    # annotations are still strings (from __future__ import annotations), and Typer would not
    # see an Option inside a string annotation.
    max_queue: int = typer.Option(0, "--max-queue", min=0, help="Most requests waiting for a slot; one more gets "
                                  "an error event with code queue_full at once. 0 = no limit."),
    on_eof: OnEof = typer.Option(OnEof.drain, "--on-eof", help="At end of input: drain = finish what is in "
                                 "flight, then exit; cancel = cancel it, then exit."),
    *,
    opts: SharedOptions,
) -> None:
    """Serve requests from stdin as a JSON-lines co-process: requests in, events out, one per line.

    Requests join the running batch as they arrive: {"id": "a1", "prompt": "..."} or {"id": "a1", "messages": [...]}

    A request may set any sampling field, and "stream": true for token events.

    Control lines: {"op": "cancel", "id": "a1"} and {"op": "stats"}.

    Events: ready (model loaded), token, done, error, stats. Every request ends with exactly one done or error.
    """
    from .serve_loop import serve

    resolved = resolve_options(opts)
    with cli_errors():
        resolved.engine = resolved.engine.replace(max_queue=max_queue).validate()
        # The protocol owns stdout. Keep a private copy of it for events and point fd 1 at
        # stderr, so nothing else (a stray print, a C library's printf) can corrupt the stream.
        events_fd = os.dup(1)
        os.dup2(2, 1)
        engine = open_engine(resolved)
        try:
            code = serve(engine, 0, events_fd, on_eof.value)
        finally:
            engine.close()  # serve closes it too; this covers a failure inside serve
            os.close(events_fd)
    raise typer.Exit(code)
