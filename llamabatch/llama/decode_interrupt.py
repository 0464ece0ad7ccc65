"""Stopping a llama_decode part-way, from another thread, without Python in the compute loop.

llama.cpp's CPU backend asks the context's abort callback after every graph node (ggml-cpu.c);
once it answers true, llama_decode returns 2 and takes the ubatch's cells out of the KV cache
again (llama-context.cpp: "the last ubatch failed or was aborted"), so a tick of one graph run
is as if it never ran. A Python callback would take the GIL after every node, hundreds of
times a tick, and wait behind whichever Python thread holds it; so the callback is the C
library's strlen over a two-byte buffer [flag, 0]: it returns 0 while the flag byte is 0 and 1
once another thread sets it, and the compute thread never enters Python.
"""
from __future__ import annotations

import ctypes
import os

from llama_cpp import llama_cpp as C


def _c_strlen() -> C.ggml_abort_callback | None:
    """strlen as a ggml_abort_callback (bool f(void *)): its size_t result, 0 or 1 here, is
    the boolean the caller reads. None where the C library cannot be opened."""
    try:
        libc = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    return C.ggml_abort_callback(address) if address else None


class DecodeInterrupt:
    """The abort flag of one llama context: `stop()` from any thread makes its llama_decode in
    flight return 2 at the next graph node; the flag stays set until `clear()`."""

    def __init__(self, ctx: C.llama_context_p) -> None:
        self._flag = ctypes.create_string_buffer(2)  # [flag, NUL]
        self._callback = _c_strlen()  # kept: llama.cpp holds only the pointer
        self.available = self._callback is not None
        if self.available:
            C.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._flag, ctypes.c_void_p))

    def stop(self) -> None:
        self._flag[0] = b"\x01"

    def clear(self) -> None:
        self._flag[0] = b"\x00"
