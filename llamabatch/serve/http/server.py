"""Listening: the address rule, the socket, and uvicorn running the app.

A server on a loopback address (127.0.0.1 by default, ::1, localhost) can be reached only from
this machine; any other address needs an API key, or it is refused before anything listens.
The socket is bound here (port 0 picks a free one) and handed to uvicorn, so the caller knows
the port before the first request.
"""
from __future__ import annotations

import errno
import ipaddress
import socket
import threading
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequest


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Raise InvalidRequest (one line) for a non-loopback host without an API key."""
    if not api_key and not is_loopback(host):
        raise InvalidRequest(f"refusing to listen on {host} without an API key: anyone who can reach it could "
                             "use the model and read every file; give --api-key KEY (or LLAMABATCH_API_KEY), "
                             "or listen on 127.0.0.1")


def bind(host: str, port: int) -> socket.socket:
    """The listening socket. Raises InvalidRequest (one line naming the address) when it cannot
    be had: the port taken, a host that is no address of this machine, a name that resolves to
    none. `serve` binds before it opens the engine, so this costs no model load."""
    name = host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((name, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InvalidRequest(_cannot_listen(host, port, exc)) from None
    return sock


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    """Why `host`:`port` cannot be listened on, and what to change, in one line."""
    where = f"{'[' + host.strip('[]') + ']' if ':' in host else host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {where}: port {port} is already in use; choose another --port (0: a free one)"
    if isinstance(exc, socket.gaierror):  # the name resolves to no address
        return f"cannot listen on {where}: --host {host} is not an address this machine knows ({exc.strerror})"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: --host {host} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: port {port} needs privileges; choose a --port above 1023"
    return f"cannot listen on {where}: {exc.strerror or exc}"


@dataclass
class Listening:
    server: Any  # uvicorn.Server
    sock: socket.socket

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (in the main thread) or stop()."""
        self.server.run(sockets=[self.sock])

    @property
    def stop_signal(self) -> int | None:
        """The signal that stopped the server (SIGINT, SIGTERM), or None."""
        return getattr(self.server, "stop_signal", None)

    def stop(self) -> None:
        self.server.should_exit = True

    def run_in_thread(self) -> threading.Thread:
        """Serve from a thread (tests, benchmarks); returns once the server accepts requests."""
        thread = threading.Thread(target=self.run, name="llamabatch-http", daemon=True)
        thread.start()
        while not self.server.started and thread.is_alive():
            threading.Event().wait(0.01)
        return thread


def _server_class() -> type:
    import uvicorn

    class SignalledServer(uvicorn.Server):
        """uvicorn's Server, remembering the signal that stopped it. uvicorn raises that signal
        again once it has shut down, but where the process inherited SIGINT ignored (started in
        the background by a shell without job control) the raise does nothing, and `serve` would
        exit 0 after a Ctrl-C or `kill -INT`; `stop_signal` lets it exit 130 all the same."""

        stop_signal: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stop_signal is None:
                self.stop_signal = sig
            super().handle_exit(sig, frame)

    return SignalledServer


def listen(app: Any, host: str, port: int, sock: socket.socket | None = None) -> Listening:
    """uvicorn serving `app` on `sock` (already bound: `bind`), else on a socket bound here."""
    import uvicorn

    # keep-alive well past clients' own (the openai SDK's pool drops idle connections after 5 s): when
    # both sides time out together, a request sent on a connection the server is closing is reset
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False,
                            timeout_graceful_shutdown=5, timeout_keep_alive=75)
    return Listening(_server_class()(config), sock if sock is not None else bind(host, port))
