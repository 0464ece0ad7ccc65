"""The child process of the supervised engine: what the registered process "engine-child"
(`python -m llamabatch --process engine-child`) runs (`serve_parent`; the CLI's process entry
only turns its outcome into the exit status).

It runs an ordinary in-process Engine and speaks frames (the dataclasses in wire.py) with its parent:

    stdin   parent -> child   Init once, then Submit / Cancel / Tokenize / TokenPieces / Close
    stdout  child -> parent   Ready or LoadError once, then Batch: everything one tick
                              produced (items also carry notices, e.g. a chat-template fallback)
    stderr  llama.cpp's log lines and whatever C++ prints when it aborts; the parent keeps
            the last lines to name the cause of a crash

Token streams cross the pipe once per tick: Deltas, Results and the TickRecord of a tick go
in one frame, written by the engine thread when the tick ends. `pid` is the parent's
request id; the child's own ids restart with every child and never leave it.

The child dies with its parent: die_with_parent() arms PR_SET_PDEATHSIG (SIGKILL), and it
also exits when its stdin closes.

Test-only hooks (environment): LLAMABATCH_TEST_CRASH_PROMPT=TEXT makes the child call
os.abort() when a request whose prompt is exactly TEXT produces its first token;
LLAMABATCH_TEST_CRASH_AT_LOAD=1 makes it abort before loading the model. The runner is the
model, loaded, unless Init names a registered one (in_process/runners.py: the supervisor's unit
tests run the scripted fake runner this way).
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from ..core.embedding import EmbedRequest
from ..core.engine import EngineCore
from ..core.handle import RequestHandle
from ..errors import LlamaBatchError
from ..results import Delta, Result
from ..core.engine_base import error_result
from ..core.telemetry import RequestRecord, TickRecord
from . import wire

CRASH_PROMPT_ENV = "LLAMABATCH_TEST_CRASH_PROMPT"
CRASH_AT_LOAD_ENV = "LLAMABATCH_TEST_CRASH_AT_LOAD"
STRAY_FLUSH_S = 0.002  # events outside a tick (a submit that failed, a cancel) wait this long to be sent


class Link:
    """The child's side of the pipes: submits into the engine, batches what comes out."""

    def __init__(self, engine: EngineCore, out_fd: int):
        self.engine = engine
        self.out_fd = out_fd
        self._outbox: list[wire.Item] = []
        self._lock = threading.Lock()  # the outbox
        self._write_lock = threading.Lock()  # one frame at a time on out_fd
        self._handles: dict[int, RequestHandle] = {}  # pid -> handle, until its Result
        self._pids: dict[int, int] = {}  # child request id -> pid
        self._wake = threading.Event()
        self._closed = False
        self._crash_prompt = os.environ.get(CRASH_PROMPT_ENV)
        self._doomed: set[int] = set()
        engine.subscribe(self._on_record)
        # A template fallback is said once, by the parent (which knows where stderr goes)
        engine.on_notice = lambda line: self._append(wire.Notice(line))
        self._flusher = threading.Thread(target=self._flush_strays, name="llamabatch-child-flush", daemon=True)
        self._flusher.start()

    def serve(self, in_fd: int) -> None:
        """Handle the parent's frames until it says close or its end of the pipe goes away."""
        while True:
            try:
                frame = wire.recv(in_fd)
            except EOFError:
                break
            if isinstance(frame, wire.Submit):
                self._submit(frame.requests)
            elif isinstance(frame, wire.Cancel):
                handle = self._handles.get(frame.pid)
                if handle is not None:
                    handle.cancel()
            elif isinstance(frame, (wire.Tokenize, wire.TokenPieces)):
                self._tokenize(frame)
            elif isinstance(frame, wire.Close):
                break
        self.engine.close()  # cancels what is left: those Results go out below
        self._closed = True
        self._wake.set()
        self.flush()

    def _submit(self, requests: list[wire.Request]) -> None:
        # Inside hold(): the engine thread admits none of them before their ids are known here.
        with self.engine.hold():
            for request in requests:
                pid = request.pid
                if self._crash_prompt is not None and request.prompt == self._crash_prompt:
                    self._doomed.add(pid)
                try:
                    if isinstance(request.prompt, EmbedRequest):  # its timeout: what the parent left of it
                        handle = self.engine._submit_embed(
                            dataclasses.replace(request.prompt, timeout=request.params.timeout), self._callback(pid))
                    else:
                        handle = self.engine.submit(request.prompt, request.params, stream=False,
                                                    callback=self._callback(pid))
                except Exception as exc:  # in-process this would raise to the caller: here it ends the request
                    code = exc.code if isinstance(exc, LlamaBatchError) else "internal_error"
                    self._append(wire.Finished(pid, error_result(pid, f"{type(exc).__name__}: {exc}", code,
                                                                 seed=request.params.seed)))
                    continue
                if not handle.done:
                    self._handles[pid] = handle
                    self._pids[handle.request_id] = pid
        self._wake.set()

    def _tokenize(self, call: wire.Tokenize | wire.TokenPieces) -> None:
        try:
            if isinstance(call, wire.TokenPieces):
                reply = wire.Tokenized(call.call_id, self.engine.token_pieces(call.tokens))
            else:
                reply = wire.Tokenized(call.call_id, self.engine.tokenize(call.text, special=call.special,
                                                                            add_special=call.add_special))
        except Exception as exc:
            reply = wire.Tokenized(call.call_id, None,
                                   exc if isinstance(exc, LlamaBatchError) else RuntimeError(str(exc)))
        self._append(reply)

    # -- from the engine thread -------------------------------------------------------------

    def _callback(self, pid: int):
        def on_item(handle: RequestHandle, item: Delta | Result) -> None:
            if isinstance(item, Delta):
                if pid in self._doomed:
                    os.write(2, f"llamabatch test hook: {CRASH_PROMPT_ENV} matched; calling os.abort()\n".encode())
                    os.abort()
                # Deltas come from a tick, whose end sends them: no wake-up per token
                self._append(wire.Streamed(pid, item.text, item.token_ids, item.reasoning), wake=False)
            else:
                self._handles.pop(pid, None)
                self._pids.pop(handle.request_id, None)
                self._append(wire.Finished(pid, item))  # may come from a tick with nothing to decode: wake the flusher
        return on_item

    def _on_record(self, record: Any) -> None:
        if isinstance(record, TickRecord):
            self._append(wire.Tick(record), wake=False)
            self.flush()  # the tick is over: send all it produced in one frame
        elif isinstance(record, RequestRecord) and record.kind == "start":
            pid = self._pids.get(record.request_id)
            if pid is not None:
                self._append(wire.Started(pid), wake=False)
        # done/exception records: the parent makes its own, once per request across restarts

    # -- sending ----------------------------------------------------------------------------

    def _append(self, item: wire.Item, wake: bool = True) -> None:
        with self._lock:
            self._outbox.append(item)
        if wake:
            self._wake.set()

    def flush(self) -> None:
        with self._write_lock:
            with self._lock:
                items, self._outbox = self._outbox, []
            if items:
                s = self.engine.stats()
                wire.send(self.out_fd, wire.Batch(items, wire.SlotCounts(s.slots_idle, s.slots_prefilling,
                                                                         s.slots_generating, s.queue_depth,
                                                                         s.kv_cells_used)))

    def _flush_strays(self) -> None:
        while not self._closed:
            self._wake.wait()
            time.sleep(STRAY_FLUSH_S)  # a tick in progress sends its own frame when it ends
            self._wake.clear()
            try:
                self.flush()
            except OSError:
                return  # the parent is gone; the main thread sees EOF and exits


def _log_llama_cpp_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    runner_log = logging.getLogger("llamabatch.runner")
    runner_log.addHandler(handler)
    runner_log.setLevel(logging.DEBUG)
    runner_log.propagate = False


def _open_engine(init: wire.Init) -> EngineCore:
    """The parent resolved the settings: the child takes the model file as it is, decides
    n_parallel "auto" (on its own process) and loads the runner (in_process/worker_engine.py)."""
    from ..in_process.worker_engine import open_worker_engine
    from ..settings.ready import from_parent

    return open_worker_engine(from_parent(init.config, init.default_params), init.runner)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent's thread that started us ends: the parent
    exiting in any way (kill -9 included) then ends this process even while it is stopped or
    busy inside llama.cpp (not reading stdin, so the EOF tie alone would not end it).
    Linux only; elsewhere stdin's EOF is the only tie. Returns whether it is armed; raises
    ParentGone when the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # The parent may have died between our start and the prctl: then we were re-parented
    # already and no signal will come.
    from .child_process import PARENT_PID_ENV

    expected = os.environ.get(PARENT_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        raise ParentGone(f"the parent (pid {expected}) ended before this child started")
    return True


class ParentGone(LlamaBatchError):
    """The parent ended before the child could tie itself to it: there is no one to serve."""

    code = "parent_gone"


def serve_parent() -> int:
    """Load the engine the parent's Init asks for, then serve its frames until it closes or
    goes away. Returns the process's exit status: 0 done, 1 the engine did not load (the
    parent got a LoadError frame). Raises ParentGone before anything else when it is gone."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    out_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print or C printf must not corrupt the frames
    _log_llama_cpp_to_stderr()
    try:
        init = wire.recv(0)
    except EOFError:
        return 0
    assert isinstance(init, wire.Init), init
    if os.environ.get(CRASH_AT_LOAD_ENV) == "1":
        os.write(2, f"llamabatch test hook: {CRASH_AT_LOAD_ENV}=1; calling os.abort()\n".encode())
        os.abort()
    try:
        engine = _open_engine(init)
    except LlamaBatchError as exc:
        wire.send(out_fd, wire.LoadError(type(exc).__name__, str(exc)))
        return 1
    runner = engine.runner
    wire.send(out_fd, wire.Ready(
        model_path=engine.model_path, slot_ctx=engine.slot_ctx, n_slots=runner.n_slots, pid=os.getpid(),
        kernels=engine.kernels, slots_reason=engine.slots_reason,
        n_vocab=runner.n_vocab, metadata=runner.metadata, bos_text=runner.bos_text, eos_text=runner.eos_text))
    Link(engine, out_fd).serve(0)
    return 0
