"""One child process as the parent sees it: its pipes, its stderr tail, how it died."""
from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import threading
from typing import Any

from .. import errors
from ..errors import LlamaBatchError, ModelLoadError
from ..processes import entries
from . import wire

log = logging.getLogger("llamabatch.child")
TAIL_LINES = 20
PARENT_PID_ENV = "LLAMABATCH_SUPERVISOR_PID"  # the child checks it after arming its parent-death signal


class StartFailed(Exception):
    """The child died (or hung up) before it said ready."""


class ChildProcess:
    def __init__(self, config: Any, default_params: Any, env: dict[str, str] | None = None, runner: Any = None):
        # A new session: Ctrl-C in the terminal reaches the parent only, which decides what it
        # means. The child still ends with the parent: it asks the kernel for SIGKILL when the
        # thread that started it ends (child.py; kill -9 of the parent included, and a stopped
        # child too), and it exits when its stdin closes.
        env = dict(os.environ if env is None else env)
        env[PARENT_PID_ENV] = str(os.getpid())
        self.proc = subprocess.Popen(entries.command(entries.ENGINE_CHILD), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     env=env)
        self.kill_reason: str | None = None  # set when the parent killed it on purpose (watchdog, load bound)
        self.info: wire.Ready | None = None  # once wait_ready() returned
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._send_lock = threading.Lock()
        self._stderr = threading.Thread(target=self._read_stderr, name="llamabatch-child-stderr", daemon=True)
        self._stderr.start()
        self.send(wire.Init(config, default_params, runner))

    # -- talking ------------------------------------------------------------------------------

    def send(self, message: wire.Frame) -> bool:
        """Write one frame; False when the child is gone (its death is noticed by the reader)."""
        try:
            with self._send_lock:
                wire.send(self.proc.stdin.fileno(), message)
            return True
        except (OSError, ValueError):
            return False

    def recv(self) -> wire.Frame:
        return wire.recv(self.proc.stdout.fileno())

    def wait_ready(self, timeout: float | None = None) -> wire.Ready:
        """The child's facts once the model is loaded. Raises the child's own load error (the
        same each time: no point retrying) or StartFailed when it died on the way, or when it
        was not ready within `timeout` seconds (then it is killed: a hung load)."""
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, self.kill, (f"killed: not ready {timeout:.0f}s after it started",))
            timer.daemon = True
            timer.start()
        try:
            message = self.recv()
        except (EOFError, OSError):
            raise StartFailed(self.death()) from None
        finally:
            if timer is not None:
                timer.cancel()
        if isinstance(message, wire.LoadError):
            self.wait()
            kind = getattr(errors, message.kind, None)
            raise (kind if isinstance(kind, type) and issubclass(kind, LlamaBatchError) else ModelLoadError)(
                message.message)
        if not isinstance(message, wire.Ready):
            self.kill(f"killed: it sent {type(message).__name__} before it was ready")
            raise StartFailed(self.death())
        self.info = message
        return message

    # -- ending -------------------------------------------------------------------------------

    def kill(self, reason: str) -> None:
        """SIGKILL (it works on a stopped process too); `reason` replaces "killed by SIGKILL" in death()."""
        if self.kill_reason is None:
            self.kill_reason = reason
        try:
            self.proc.kill()
        except OSError:  # already reaped
            pass

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def death(self) -> str:
        """How the child ended, with llama.cpp's last words: 'killed by SIGABRT; last log line: ...'."""
        code = self.wait(10)
        self._stderr.join(5)
        why = f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"
        if self.kill_reason is not None and code < 0:
            why = self.kill_reason
        last = self.last_line()
        return f"{why}; last log line: {last}" if last else why

    def last_line(self) -> str:
        for line in reversed(self._tail):
            if line.strip():
                return line.strip()[:300]
        return ""

    def close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _read_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self._tail.append(line)
            log.debug("%s", line)
        self.proc.stderr.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

