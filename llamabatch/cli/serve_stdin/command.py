"""`llamabatch serve-stdin`: a JSONL co-process. The protocol and its threads are the
library's (llamabatch/serve/stdin/); this module is the command line around them."""
from __future__ import annotations

import contextlib
import os
import sys
from enum import Enum
from typing import Annotated, Iterator, Optional

import typer

from ...settings.file_layer import command_setting
from ...errors import StreamUnusable
from ..engine_setup import open_engine, resolve_options
from ..env import Environment
from ..engine_options import EngineOptions, with_engine_options
from ...settings.time_bounds import time_bounds
from ..time_bound_flags import SERVE_DRAIN_HELP, WATCHDOG_HELP


class OnEof(str, Enum):
    drain = "drain"
    cancel = "cancel"


@with_engine_options
def serve_stdin(
    # None = not given: the config file's [serve-stdin] table may set these, then the defaults apply.
    max_queue: Annotated[Optional[int], typer.Option(
        "--max-queue", min=0, show_default=False,
        help="Most requests waiting for a slot; one more gets an error event with code queue_full at once. "
             "0 = no limit \\[default: 0]")] = None,
    on_eof: Annotated[Optional[OnEof], typer.Option(
        "--on-eof", show_default=False,
        help="At end of input: drain = finish what is in flight, then exit; cancel = cancel it, then exit "
             "\\[default: drain]")] = None,
    isolate: Annotated[bool, typer.Option(
        "--isolate/--no-isolate",
        help="Run llama.cpp in a supervised child process: a crash costs a restart and the request causing it "
             "gets an engine_crashed error. --no-isolate: in this process (a crash ends the server).")] = True,
    watchdog: Annotated[Optional[float], typer.Option(
        "--watchdog", min=0.0, metavar="SECONDS", show_default=False, help=WATCHDOG_HELP)] = None,
    drain_timeout: Annotated[Optional[float], typer.Option(
        "--drain-timeout", min=0.0, metavar="SECONDS", show_default=False,
        help=SERVE_DRAIN_HELP)] = None,
    *,
    opts: EngineOptions,
    env: Environment,
) -> None:
    """Serve requests from stdin as a JSON-lines co-process: requests in, events out, one per line.

    Requests join the running batch as they arrive: {"id": "a1", "prompt": "..."} or {"id": "a1", "messages": [...]}

    A request may set any sampling field, and "stream": true for token events.

    Control lines: {"op": "cancel", "id": "a1"} and {"op": "stats"}.

    Events: ready (model loaded), token, done, error, stats. Every request ends with exactly one done or error.
    """
    from ...serve.stdin.loop import serve

    resolved = resolve_options(opts, env)
    bounds = time_bounds("serve-stdin", watchdog, drain_timeout, env.config_path)
    if max_queue is None:
        max_queue = command_setting("serve-stdin", "max_queue", 0, env.config_path)
    eof = on_eof.value if on_eof is not None else command_setting("serve-stdin", "on_eof", "drain", env.config_path)
    resolved.engine = resolved.engine.replace(max_queue=max_queue).validate()
    in_fd, out_fd = env.fileno("stdin"), env.fileno("stdout")
    if in_fd is None or out_fd is None:  # the loop reads and writes raw fds (llamabatch/serve/stdin/loop.py)
        raise StreamUnusable("serve-stdin needs stdin and stdout with file descriptors")
    with protocol_stdout(out_fd) as events_fd:
        engine = open_engine(resolved, env, isolated=isolate, watchdog_s=bounds.watchdog_s)
        if engine.slots_reason:  # for people, on stderr: the ready event has the count
            print(f"llamabatch serve-stdin: {engine.config.n_parallel} slots x {engine.slot_ctx} tokens "
                  f"({engine.slots_reason})", file=env.stderr, flush=True)
        try:
            code = serve(engine, in_fd, events_fd, eof, drain_timeout=bounds.drain_timeout_s, say=env.say)
        finally:
            engine.close()  # serve closes it too; this covers a failure inside serve
    raise typer.Exit(code)


@contextlib.contextmanager
def protocol_stdout(fd: int) -> Iterator[int]:
    """The fd to write events to. When events go to the process's stdout (fd 1), the
    protocol owns it while serving: yield a private copy of fd 1 and point fd 1 at stderr
    meanwhile, so nothing else (a stray print, a C library's printf) can corrupt the stream.
    fd 1 is put back afterwards: a caller that embeds the command keeps its stdout."""
    if fd != 1:  # an embedding caller's own stream: nothing else writes there
        yield fd
        return
    sys.stdout.flush()
    events_fd = os.dup(1)
    saved_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        yield events_fd
    finally:
        sys.stdout.flush()  # what a stray print left in Python's buffer goes to stderr, as meant
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        os.close(events_fd)
