"""The serve-stdin I/O loop: a reader thread, one writer thread, the engine between them.

    stdin  --reader thread-->  parse_line  -->  engine.submit(callback=...)
    engine thread: Deltas and Results  -->  Output queue  --writer thread-->  stdout
    main thread: waits for EOF / a signal / a broken pipe, then shuts down in order

Why this shape:
- Reading stdin never waits on generation: the reader only parses and submits.
- The engine thread never waits on a slow reader of stdout: callbacks put finished lines
  on the output queue without blocking (a blocking one would stall every request's
  generation). Backpressure comes from the other end instead: while MAX_PENDING_EVENTS
  lines wait for the reader of stdout, no new input line is read, so the client's writes
  block (the pipe contract) and memory stays bounded by that plus what the requests
  already in flight still generate.
- One writer thread owns the output fd, so lines of concurrent requests never mix.
- Reads and writes use os.read / os.write on raw fds, never sys.stdin / sys.stdout, so a
  daemon thread blocked in I/O holds no Python buffer lock at interpreter exit.
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import queue
import select
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ...api import EngineAPI
from ...core.handle import RequestHandle
from ...errors import EngineClosed, QueueFull
from .protocol import (BadLine, Cancel, RequestId, Stats, Submit, cancel_ignored_event, error_event, encode, parse_line, ready_event, stats_event, terminal_event, token_event)
from ...results import Delta, Result
from ...core.telemetry import TickRecord

log = logging.getLogger("llamabatch.serve")

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what `seq 1e9 | head -1` reports for seq: pipefail scripts know it
_CLOSE = None


# Lines written but not yet read by the client at which serve-stdin stops reading requests.
MAX_PENDING_EVENTS = 1024


class Output:
    """The single writer of protocol lines. `send` never blocks; a broken pipe is remembered."""

    def __init__(self, fd: int, on_broken: Callable[[], None] = lambda: None):
        self._fd = fd
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()  # never blocks the engine thread
        self._on_broken = on_broken
        self.broken = False
        self._pending = 0  # lines queued and not yet written
        self._room = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="llamabatch-serve-writer", daemon=True)
        self._thread.start()

    def send(self, event: dict[str, Any]) -> None:
        if not self.broken:
            data = encode(event)
            with self._room:
                self._pending += 1
            self._queue.put(data)

    def wait_for_room(self, limit: int, give_up: Callable[[], bool] = lambda: False) -> None:
        """Block while `limit` or more lines wait to be written (the reader of stdout is slow)."""
        with self._room:
            while self._pending >= limit and not self.broken and not give_up():
                self._room.wait(0.1)

    def _written(self) -> None:
        with self._room:
            self._pending -= 1
            self._room.notify_all()

    def close(self, give_up: Callable[[], bool] = lambda: False) -> None:
        """Write everything queued, then stop. `give_up()` true ends the wait early (a second signal)."""
        self._queue.put(_CLOSE)
        while self._thread.is_alive() and not give_up():
            self._thread.join(0.1)

    def _run(self) -> None:
        while True:
            data = self._queue.get()
            if data is _CLOSE:
                return
            try:
                if self.broken:
                    continue  # nobody is reading: drop, but keep consuming until _CLOSE
                view = memoryview(data)
                while view:  # os.write may write less than asked on a pipe
                    view = view[os.write(self._fd, view):]
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.EBADF, errno.ECONNRESET, errno.EINVAL):
                    log.error("writing stdout failed: %s", exc)
                self.broken = True
                self._on_broken()
            finally:
                self._written()


@dataclass
class Flight:
    """A request that has been accepted and has not had its terminal event yet."""

    id: RequestId
    line: int
    stream: bool  # send token events
    samples: int = 1  # n: token events name their sample when n > 1
    encoding_format: str = "float"  # an embeddings request's: how its vectors are written
    tools: Any = None  # a chat request's ToolRequest (protocol.Submit.tools)
    handle: RequestHandle | None = None
    # line numbers of the cancel lines aimed at this request, in order: each gets one reply
    # when the request ends (see _on_item)
    cancel_lines: list[int] = field(default_factory=list)


class Server:
    """Turns input lines into engine work and engine events into output lines."""

    def __init__(self, engine: EngineAPI, output: Output, wake: threading.Event,
                 max_pending: int = MAX_PENDING_EVENTS):
        self.engine = engine
        self.output = output
        self.max_pending = max_pending  # backpressure: see the module docstring
        self.wake = wake  # set when something the main loop waits for may have happened
        self.eof = False
        self._flights: dict[RequestId, Flight] = {}
        self._flights_lock = threading.Lock()
        # Held while one line is handled, so shutdown can wait for a half-handled line and then
        # be sure the reader submits and writes nothing more.
        self._line_lock = threading.Lock()
        self._stopping = False
        self._max_decode_tokens = 0
        self._last_tick: TickRecord | None = None
        self._unsubscribe = engine.subscribe(self._on_record)

    @property
    def in_flight(self) -> int:
        with self._flights_lock:
            return len(self._flights)

    def stop_reading(self) -> None:
        """After this returns, no further line is handled (lines still unread are never answered)."""
        with self._line_lock:
            self._stopping = True

    def close(self) -> None:
        self._unsubscribe()

    # -- the reader thread ----------------------------------------------------------------------

    def read_from(self, fd: int) -> None:
        try:
            for number, raw in enumerate(_lines(fd), start=1):
                self.output.wait_for_room(self.max_pending, lambda: self._stopping)
                with self._line_lock:
                    if self._stopping:
                        return
                    self.handle_line(raw, number)
        finally:
            self.eof = True
            self.wake.set()

    def handle_line(self, raw: bytes | None, number: int) -> None:
        try:
            if raw is None:
                raise BadLine("line_too_long", f"line {number} is longer than {MAX_LINE_BYTES >> 20} MiB", number)
            command = parse_line(raw, number, self.engine.default_params)
            if isinstance(command, Submit):
                self._submit(command)
            elif isinstance(command, Cancel):
                self._cancel(command)
            elif isinstance(command, Stats):
                self.output.send(self._stats(command))
        except BadLine as bad:
            self.output.send(bad.event())
        except Exception as exc:  # a bug here must cost one line, never the other requests
            log.exception("line %d failed", number)
            self.output.send(error_event(None, "internal_error", f"line {number}: {type(exc).__name__}: {exc}",
                                         line=number))

    def _submit(self, command: Submit) -> None:
        flight = Flight(command.id, command.line, command.stream, command.params.n)
        flight.tools = command.tools
        if command.embed is not None:
            flight.samples, flight.encoding_format = 1, command.embed.encoding_format
        with self._flights_lock:
            earlier = self._flights.get(command.id)
            if earlier is not None:
                raise BadLine("duplicate_id", f"id {command.id!r} is already in flight (line {earlier.line})",
                              command.line, command.id)
            self._flights[command.id] = flight
        callback = functools.partial(self._on_item, flight)
        try:
            # A request the engine rejects at once (prompt too long...) gets its Result through
            # the callback before submit returns: the flight is registered first for that reason.
            # stream=False: Deltas still reach the callback; the handle need not keep them too.
            if command.embed is not None:
                e = command.embed
                flight.handle = self.engine.submit_embedding(e.inputs, pooling=e.pooling, normalize=e.normalize,
                                                             truncate=e.truncate, timeout=e.timeout,
                                                             dimensions=e.dimensions, callback=callback)
            else:
                flight.handle = self.engine.submit(command.prompt, command.params, stream=False, callback=callback)
        except QueueFull as exc:
            self._forget(flight)
            raise BadLine(exc.code, str(exc), command.line, command.id) from None
        except EngineClosed as exc:
            self._forget(flight)
            raise BadLine(exc.code, str(exc), command.line, command.id) from None
        except Exception as exc:  # a bug: this request's error, and it must not stay "in flight" forever
            log.exception("submitting line %d failed", command.line)
            self._forget(flight)
            raise BadLine("internal_error", f"line {command.line}: {type(exc).__name__}: {exc}", command.line,
                          command.id) from None

    def _cancel(self, command: Cancel) -> None:
        with self._flights_lock:
            flight = self._flights.get(command.id)
            if flight is not None and flight.handle is not None:
                # noted under the lock that _on_item takes to retire the flight, so the line is
                # either noted before the request ends (and answered then) or finds it gone
                flight.cancel_lines.append(command.line)
        if flight is None or flight.handle is None:
            raise BadLine("unknown_id", f"no request with id {command.id!r} is in flight", command.line,
                          command.id, op="cancel")
        flight.handle.cancel()  # the reply comes when the request ends: see _on_item

    def _stats(self, command: Stats) -> dict[str, Any]:
        last = self._last_tick
        telemetry = {
            "in_flight": self.in_flight,
            "decode_tokens": self.engine.telemetry.totals.decode_tokens,
            "prefill_tokens": self.engine.telemetry.totals.prefill_tokens,
            "max_decode_tokens_per_tick": self._max_decode_tokens,
            "last_tick": last.to_dict() if last is not None else None,
        }
        if self.engine.recovers_crashes:  # a supervised engine: crashes survived so far
            telemetry["engine_restarts"] = self.engine.restarts
            telemetry["engine_hangs"] = self.engine.hangs  # of those restarts, hung children the watchdog killed
            telemetry["isolated"] = len(self.engine.isolated)
        return stats_event(self.engine.stats().to_dict(), telemetry, command.id)

    def _forget(self, flight: Flight) -> None:
        with self._flights_lock:
            if self._flights.get(flight.id) is flight:
                del self._flights[flight.id]

    # -- the engine thread (keep quick) ----------------------------------------------------------

    def _on_item(self, flight: Flight, handle: RequestHandle, item: Delta | Result) -> None:
        if isinstance(item, Delta):
            if (item.text or item.reasoning) and flight.stream:
                self.output.send(token_event(flight.id, item.text, item.index if flight.samples > 1 else None,
                                             item.reasoning))
            return
        # Queue the terminal event before the flight disappears: once in_flight reads 0, every
        # terminal event is ahead of the writer's close marker.
        self.output.send(terminal_event(flight.id, item, flight.line, flight.encoding_format, flight.tools))
        with self._flights_lock:
            # Every cancel line gets one reply. A `done` with "cancelled" answers the first; a
            # cancel that raced with the request's own end (the token that finished it was
            # already sampled) or a repeated cancel gets cancel_ignored, so a client can account
            # for each line it wrote. Sent under the lock: no cancel can be noted after this.
            answered = item.finish_reason == "cancelled"
            for number in flight.cancel_lines[1:] if answered else flight.cancel_lines:
                self.output.send(cancel_ignored_event(
                    flight.id, number, "already cancelled" if answered else "already finished"))
            if self._flights.get(flight.id) is flight:
                del self._flights[flight.id]
        self.wake.set()

    def _on_record(self, record: Any) -> None:
        if isinstance(record, TickRecord):
            self._last_tick = record
            # requests decoded together: a decode chunk's guess rows are not requests
            decoded = record.decode_tokens - record.drafted_tokens
            if decoded > self._max_decode_tokens:
                self._max_decode_tokens = decoded


MAX_LINE_BYTES = 64 << 20  # far above any prompt a slot can hold; stops input without newlines eating memory


def _lines(fd: int, limit: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """Lines of fd as they arrive (a last line without newline counts), None for a line over
    `limit` bytes (its bytes are skipped, not kept). Ends at EOF or a read error."""
    pending: list[bytes] = []  # pieces of a line not yet ended (joined once, not per read)
    size = 0
    too_long = False
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:
            log.debug("reading stdin failed: %s", exc)
            chunk = b""
        if not chunk:
            if too_long or pending:
                yield None if too_long else b"".join(pending)
            return
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            yield None if too_long or size + len(piece) > limit else b"".join([*pending, piece])
            pending, size, too_long = [], 0, False
        if rest and not too_long:
            pending.append(rest)
            size += len(rest)
            if size > limit:
                pending, size, too_long = [], 0, True


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve(engine: EngineAPI, in_fd: int, out_fd: int, on_eof: str = "drain",
          max_pending: int = MAX_PENDING_EVENTS, drain_timeout: float | None = None,
          say: Callable[[str], None] = lambda line: None) -> int:
    """Serve until EOF (drain or cancel what is in flight), a signal, or a broken stdout.

    Closes the engine (its close() cancels whatever is still running, and those requests'
    terminal events are written) and returns the exit code. Call from the main thread.
    After a signal a supervised engine gets `drain_timeout` seconds to stop on its own, then
    its process is killed and what is left ends "cancelled" (a hung engine cannot keep the
    server alive). `say` gets the lines for people (the engine's fatal error).
    """
    signals: list[int] = []
    woken = threading.Event()
    output = Output(out_fd, on_broken=woken.set)
    server = Server(engine, output, woken, max_pending)
    output.send(ready_event(engine.model_name, engine.config.n_parallel, engine.config.total_ctx, engine.slot_ctx))

    def on_signal(signum: int, frame: Any) -> None:
        # Only records it: a handler runs between two bytecodes of the main thread, possibly
        # inside a lock, so it must not take one. The main loop polls the list.
        signals.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        reader = threading.Thread(target=server.read_from, args=(in_fd,), name="llamabatch-serve-reader",
                                  daemon=True)  # may stay blocked in os.read: must not keep the process alive
        reader.start()
        while True:
            if signals or output.broken or _reader_gone(out_fd):
                break
            if engine.fatal_error is not None:  # its process died and could not restart
                break
            if server.eof and (on_eof == "cancel" or server.in_flight == 0):
                break
            woken.wait(0.1)
            woken.clear()
        server.stop_reading()
        server.close()
        if signals and drain_timeout is not None:  # an engine in another process is killed after that
            engine.close(timeout=drain_timeout)
        else:
            engine.close()  # cancels what is left; each gets its terminal event through the callback
        output.close(give_up=lambda: len(signals) > 1)  # a second signal: stop waiting for a stuck reader
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if signals:
        return 128 + signals[0]
    fatal = engine.fatal_error
    if fatal is not None:
        log.error("%s", fatal)
        say(f"llamabatch: error: {fatal}")
        return 1
    if output.broken or _reader_gone(out_fd):
        return EXIT_BROKEN_PIPE
    return 0


def _reader_gone(fd: int) -> bool:
    """Whether the reader of our stdout has closed it, noticed without writing: while nothing is
    generating there is nothing to write, and `serve-stdin | head -1` should still end."""
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: error and hang-up are reported anyway
    return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poller.poll(0))
