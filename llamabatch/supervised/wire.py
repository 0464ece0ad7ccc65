"""Frames between the supervised engine and its child: the messages as small dataclasses, and
their one encoder/decoder (a 4-byte length, then a pickle).

    parent -> child   Init once, then Submit / Cancel / Tokenize / TokenPieces / Close
    child -> parent   Ready or LoadError once, then Batch: everything one tick produced, as
                      items (Streamed, Finished, Started, Tick, Notice, Tokenized) and the
                      slot counts after it

Pickle because both ends are this package in the same Python (the child is started with
sys.executable), and Results, Deltas, SamplingParams and telemetry records are plain
dataclasses: no schema to keep in step. Nothing else ever writes to these pipes; `recv`
still refuses anything that is not one of the frames below (the parent then treats the
child as dead).
"""
from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass, field
from typing import Any, Union

from ..core.telemetry import TickRecord
from ..results import Result

_HEADER = struct.Struct(">I")


# -- parent -> child ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Init:
    config: Any  # EngineConfig, with the model file resolved and max_queue 0 (the parent bounds the queue)
    default_params: Any  # SamplingParams
    runner: Any = None  # in_process.runners.RunnerChoice: a registered runner instead of the model


@dataclass(frozen=True)
class Request:
    pid: int  # the parent's request id; the child's own ids never leave it
    prompt: Any
    params: Any  # SamplingParams, seed fixed (a retry samples the same way)


@dataclass(frozen=True)
class Submit:
    requests: list[Request]  # admitted together (in one hold())


@dataclass(frozen=True)
class Cancel:
    pid: int


@dataclass(frozen=True)
class Tokenize:
    call_id: int
    text: str
    special: bool
    add_special: bool = True


@dataclass(frozen=True)
class TokenPieces:
    """Each token's text (engine.token_pieces); answered with a Tokenized holding the pieces."""

    call_id: int
    tokens: list[int]


@dataclass(frozen=True)
class Close:
    pass


# -- child -> parent ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    """The child's facts once its model is loaded."""

    model_path: str
    slot_ctx: int
    n_slots: int
    pid: int
    kernels: str = ""
    slots_reason: str = ""
    n_vocab: int | None = None
    metadata: dict = field(default_factory=dict)
    bos_text: str = ""
    eos_text: str = ""


@dataclass(frozen=True)
class LoadError:
    kind: str  # the LlamaBatchError subclass's name (llamabatch.errors)
    message: str


@dataclass(frozen=True)
class Streamed:
    """New output of a request (one tick's Delta)."""

    pid: int
    text: str
    token_ids: list[int]
    reasoning: str = ""  # a thinking answer's reasoning (results.Delta.reasoning)


@dataclass(frozen=True)
class Finished:
    """A request's terminal Result in this child (request_id is the child's: the parent sets its own)."""

    pid: int
    result: Result


@dataclass(frozen=True)
class Started:
    """A request was given a slot."""

    pid: int


@dataclass(frozen=True)
class Tick:
    record: TickRecord


@dataclass(frozen=True)
class Notice:
    """A line for people, said once per engine (a chat-template fallback)."""

    line: str


@dataclass(frozen=True)
class Tokenized:
    """The answer to Tokenize (the tokens) or TokenPieces (the pieces, bytes each), or the
    error it raised."""

    call_id: int
    tokens: list[int] | list[bytes] | None
    error: BaseException | None = None


Item = Union[Streamed, Finished, Started, Tick, Notice, Tokenized]


@dataclass(frozen=True)
class SlotCounts:
    idle: int
    prefilling: int
    generating: int
    queued: int  # waiting in the child's engine for a slot
    kv_cells: int = 0  # tokens the slots hold in the KV cache


@dataclass(frozen=True)
class Batch:
    items: list[Item]
    slots: SlotCounts


Frame = Union[Init, Submit, Cancel, Tokenize, TokenPieces, Close, Ready, LoadError, Batch]
FRAMES = (Init, Submit, Cancel, Tokenize, TokenPieces, Close, Ready, LoadError, Batch)


# -- the encoder/decoder -----------------------------------------------------------------------

def send(fd: int, frame: Frame) -> None:
    """Write one frame whole (os.write may write less than asked on a pipe)."""
    if not isinstance(frame, FRAMES):
        raise TypeError(f"not a wire frame: {type(frame).__name__}")
    body = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


def recv(fd: int) -> Frame:
    """Read one frame; EOFError when the other end has closed (or died) between frames or
    mid-frame, ValueError for something that is not a frame."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    frame = pickle.loads(_read_exactly(fd, size))
    if not isinstance(frame, FRAMES):
        raise ValueError(f"not a wire frame: {type(frame).__name__}")
    return frame


def _read_exactly(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)
