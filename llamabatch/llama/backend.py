"""llama.cpp's process-wide state: the backend, started once, and the log it writes.

llama.cpp logs a lot to stderr; the callback keeps the last lines so a load failure can
name its cause (`first_error`), keeps the "model buffer size" lines apart (which layouts
the weights took: `weight_buffers`), and forwards everything to Python logging (shown
with --debug) instead of printing.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import threading
from collections import deque

from llama_cpp import llama_cpp as C

log = logging.getLogger("llamabatch.runner")

_recent_log: deque[tuple[int, str]] = deque(maxlen=40)  # (line number, text)
_log_count = itertools.count(1)
# "<buffer type> model buffer size = N MiB" lines, kept apart: a load logs hundreds of lines
_buffer_log: deque[tuple[int, str]] = deque(maxlen=64)
# the KV cache's "size = N MiB (... K (q8_0): ..." lines and how flash attention was resolved
_kv_log: deque[tuple[int, str]] = deque(maxlen=64)
_KV_MARKS = ("llama_kv_cache: size =", "Flash Attention", "flash_attn            =")
# what llama.cpp logs as warnings and errors when a decode was interrupted on purpose
# (decode_interrupt.py): the graph's status (1: GGML_STATUS_ABORTED), the cells it takes out
# again, and llama_decode's return value 2; not problems
_INTERRUPT_MARKS = ("compute_async failed with error 1", "failed to compute graph, compute status: 1",
                    "removing memory module entries", "failed to decode, ret = 2")
# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_GGML_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}


@C.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace").rstrip()
    if line:
        number = next(_log_count)
        _recent_log.append((number, line))
        if "model buffer size" in line:
            _buffer_log.append((number, line))
        elif any(mark in line for mark in _KV_MARKS):
            _kv_log.append((number, line))
        level = logging.DEBUG if any(mark in line for mark in _INTERRUPT_MARKS) else _GGML_LEVELS.get(level, logging.DEBUG)
        log.log(level, "%s", line)


_backend_lock = threading.Lock()
_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            C.llama_log_set(_log_callback, ctypes.c_void_p(0))
            C.llama_backend_init()
            _backend_ready = True


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...)."""
    return bool(C.llama_supports_gpu_offload())


def log_mark() -> int:
    """The number of the last llama.cpp log line so far; `first_error` looks only past it."""
    return _recent_log[-1][0] if _recent_log else 0


def first_error(mark: int) -> str:
    """The first line llama.cpp logged after `mark` that names a problem: later lines only
    repeat it ("failed to load model"), the first one says why."""
    lines = [text for number, text in _recent_log if number > mark]
    for line in lines:
        low = line.lower()
        if "error" in low or "failed" in low or "invalid" in low or "unknown" in low or "only supports" in low:
            return line.split(": ", 1)[-1].strip()  # drop llama.cpp's "function_name: " prefix
    return lines[-1].strip() if lines else "no details from llama.cpp"


def weight_buffers(mark: int) -> dict[str, float]:
    """MiB of weights per buffer type, as llama.cpp logged them while loading after `mark`:
    which layouts the weights really took ("CPU_REPACK", "AMX", "CPU_Mapped", ...)."""
    out: dict[str, float] = {}
    for number, text in _buffer_log:
        if number > mark:
            head, _, size = text.partition("model buffer size =")
            try:
                out[head.split(":")[-1].strip()] = float(size.split()[0])
            except (ValueError, IndexError):
                continue
    return out


def kv_cache_mib(mark: int) -> float | None:
    """MiB of KV cache llama.cpp allocated after `mark` (all its caches: a sliding-window model
    has two), from its own "llama_kv_cache: size = N MiB" lines; None when it logged none."""
    sizes = []
    for number, text in _kv_log:
        if number > mark and "llama_kv_cache: size =" in text:
            try:
                sizes.append(float(text.split("size =", 1)[1].split()[0]))
            except (ValueError, IndexError):
                continue
    return sum(sizes) if sizes else None


def flash_attention(mark: int) -> bool | None:
    """Whether the context made after `mark` runs flash attention, as llama.cpp logged it
    ("auto" resolves when the graph is reserved); None when it said nothing."""
    found = None
    for number, text in _kv_log:
        if number <= mark:
            continue
        low = text.lower()
        if "flash attention enabled" in low or text.rstrip().endswith("= enabled"):
            found = True
        elif "flash attention disabled" in low or "flash attention was auto, set to disabled" in low \
                or text.rstrip().endswith("= disabled"):
            found = False
    return found
