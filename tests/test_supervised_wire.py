"""The supervised engine's wire: every frame goes through one encoder/decoder, whole, and
anything that is not a frame is refused at both ends."""
from __future__ import annotations

import os
import pickle
import struct

import pytest

from llamabatch import EngineConfig, Result, SamplingParams, TickRecord, Timings, Usage
from llamabatch.errors import InvalidRequest
from llamabatch.supervised import wire


def roundtrip(frame):
    r, w = os.pipe()
    try:
        wire.send(w, frame)
        return wire.recv(r)
    finally:
        os.close(r)
        os.close(w)


def test_every_frame_comes_back_equal():
    result = Result(7, "hi", [104, 105], "length", Usage(1, 0, 2), Timings())
    frames = [
        wire.Init(EngineConfig(n_parallel=2), SamplingParams(max_tokens=3)),
        wire.Submit([wire.Request(1, "a prompt", SamplingParams(seed=5)), wire.Request(2, [1, 2], SamplingParams())]),
        wire.Cancel(1), wire.Tokenize(3, "text", True), wire.Close(),
        wire.Ready(model_path="/m.gguf", slot_ctx=512, n_slots=2, pid=123, kernels="k", metadata={"a": "b"}),
        wire.LoadError("ModelLoadError", "no such file"),
        wire.Batch([wire.Streamed(1, "h", [104]), wire.Finished(1, result), wire.Started(2),
                    wire.Tick(TickRecord(tick=1, batch_size=2, decode_tokens=2, prefill_tokens=0, active_slots=2,
                                         queue_depth=0, eval_ms=1.0, sample_ms=0.1, overhead_ms=0.1, wall_ms=1.2,
                                         at=0.0)),
                    wire.Notice("a fallback"), wire.Tokenized(3, [1, 2]),
                    wire.Tokenized(4, None, InvalidRequest("bad text"))],
                   wire.SlotCounts(1, 0, 1, 0)),
    ]
    for frame in frames:
        back = roundtrip(frame)
        assert type(back) is type(frame)
        if isinstance(frame, wire.Batch):  # an exception does not compare equal to its copy
            assert back.items[:-1] == frame.items[:-1] and back.slots == frame.slots
            assert isinstance(back.items[-1].error, InvalidRequest) and str(back.items[-1].error) == "bad text"
        else:
            assert back == frame


def test_anything_else_is_refused_at_both_ends():
    with pytest.raises(TypeError):
        roundtrip(("batch", [], (1, 0, 0, 0)))  # the old one-letter tuples are not frames
    r, w = os.pipe()
    try:
        body = pickle.dumps({"not": "a frame"})
        os.write(w, struct.pack(">I", len(body)) + body)
        with pytest.raises(ValueError):
            wire.recv(r)
    finally:
        os.close(r)
        os.close(w)


def test_a_closed_pipe_is_eof():
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(EOFError):
        wire.recv(r)
    os.close(r)
