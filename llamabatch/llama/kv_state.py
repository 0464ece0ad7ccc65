"""One slot's KV cache as bytes and back: what the disk prefix store keeps (core/plan.Restore).

llama.cpp's `llama_state_seq_get_data` writes a sequence's cells (positions and the K and V
rows of every layer, both caches of a sliding-window model) into a buffer;
`llama_state_seq_set_data` puts them into a sequence again, which may be another sequence id
than the one they came from. This file only wraps those two calls and the checks around them.
"""
from __future__ import annotations

import ctypes
from typing import Any

from llama_cpp import llama_cpp as C

_U8P = ctypes.POINTER(ctypes.c_uint8)


def snapshot(ctx: Any, seq: int) -> bytearray:
    """Sequence `seq`'s KV as bytes (a copy: the caller may keep it while decoding goes on).
    Costs one memcpy of what llama.cpp saves of it: every position of the full-attention layers,
    the last window of the sliding-window ones (Gemma 3 270M: 10 MB for 700 tokens, 17 MB for 3,000)."""
    size = C.llama_state_seq_get_size(ctx, seq)
    buf = bytearray(size)
    if size == 0:
        return buf
    view = (ctypes.c_uint8 * size).from_buffer(buf)
    written = C.llama_state_seq_get_data(ctx, view, size, seq)
    del view  # release the export so the bytearray may be resized or freed later
    if written != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {size} bytes for sequence {seq}")
    return buf


def restore(ctx: Any, seq: int, payload: bytes | bytearray | memoryview) -> bool:
    """Replace sequence `seq`'s cells by `payload` (from `snapshot`, maybe of another sequence
    id or another process with the same model and KV settings). False when llama.cpp refuses
    it (no room, another layout): the sequence is then empty."""
    mem = C.llama_get_memory(ctx)
    C.llama_memory_seq_rm(mem, seq, -1, -1)
    if isinstance(payload, bytes):  # immutable: point at it, no copy
        size, src = len(payload), ctypes.cast(ctypes.c_char_p(payload), _U8P)
    else:
        view = memoryview(payload).cast("B")
        if view.readonly:  # a read-only view of something else: one copy
            view = memoryview(bytearray(view))
        size = len(view)
        src = ctypes.cast((ctypes.c_uint8 * size).from_buffer(view), _U8P)  # the store's bytes, in place
    read = C.llama_state_seq_set_data(ctx, src, size, seq)
    if read == 0:
        C.llama_memory_seq_rm(mem, seq, -1, -1)  # llama.cpp may have placed part of it
        return False
    return True


def fingerprint(model_path: str, model: Any, *, kv_unified: bool, swa_full: bool,
                kernels: str, cache_types: str, flash_attn: bool) -> dict[str, str]:
    """What makes one process's saved KV bytes mean the same in another: the same model file
    (by content), the same llama.cpp (its state format and kernels), and the same cache layout
    and element types ("q8_0/q8_0": a q8_0 row read as f16 is garbage; flash attention keeps V
    by rows, without it V is transposed). The disk prefix store keeps entries apart by this,
    and refuses an entry whose header names another. V by rows is named by leaving "v_layout"
    out: what every entry was before the key existed (flash attention "auto" is on for CPUs),
    so those entries keep their folder."""
    import llama_cpp

    from ..files.model_digest import model_sha256

    out = {
        "model_sha256": model_sha256(model_path) or f"unreadable:{model_path}",
        "llama_cpp": f"{llama_cpp.__version__} state v{C.LLAMA_STATE_SEQ_VERSION}",
        "kv_layout": "unified" if kv_unified else "stream per slot",
        "swa_full": str(bool(swa_full)),
        "n_embd_layers": f"{C.llama_model_n_embd(model)}x{C.llama_model_n_layer(model)}",
        "cache_types": cache_types,
        "kernels": kernels,
    }
    if not flash_attn:
        out["v_layout"] = "transposed (no flash attention)"
    return out
