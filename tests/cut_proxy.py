"""A TCP forwarder on 127.0.0.1 that a test can cut (every connection through it closed, new
ones closed at once) and restore: a network outage between a client and a server, here the
Ray client and its server on the head."""
from __future__ import annotations

import socket
import threading


class CutProxy:
    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.down = False
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self.down = True
            cut, self._open = self._open, []
        for s in cut:
            _close(s)

    def restore(self) -> None:
        self.down = False

    def close(self) -> None:
        self.cut()
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            try:
                upstream = None if self.down else socket.create_connection(self.target)
            except OSError:
                upstream = None
            if upstream is None:
                _close(client)
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while not self.down:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        _close(a)
        _close(b)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
