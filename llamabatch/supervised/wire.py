"""Frames between the supervised engine and its child: a 4-byte length, then a pickle.

Pickle because both ends are this package in the same Python (the child is started with
sys.executable), and Results, Deltas, SamplingParams and telemetry records are plain
dataclasses: no schema to keep in step. Nothing else ever writes to these pipes.
"""
from __future__ import annotations

import os
import pickle
import struct
from typing import Any

_HEADER = struct.Struct(">I")


def send(fd: int, message: Any) -> None:
    """Write one frame whole (os.write may write less than asked on a pipe)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


def recv(fd: int) -> Any:
    """Read one frame; EOFError when the other end has closed (or died) between frames or mid-frame."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    return pickle.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)
