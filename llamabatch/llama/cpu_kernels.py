"""The CPU side of loading weights: what this build's CPU backend offers (extra buffer
types, the features ggml-cpu checks) and the llama.cpp model parameters that load the
weights in the layout a cpu_buffers choice means (cpu_buffers.py holds the rules; this
file asks llama.cpp). Deterministic mode's row rule for those kernels comes from here too.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
from typing import Any, Iterator

from llama_cpp import llama_cpp as C

from ..kernel_paths import batch_invariance as invariance
from ..kernel_paths import cpu_buffers
from .backend import init_backend
from ..config import EngineConfig
from ..errors import InvalidRequest

# Kept at import: llama_uses_model_params swaps the module's own function for a while, and
# model_params must still reach llama.cpp's.
_default_model_params = C.llama_model_default_params


@functools.lru_cache(maxsize=1)
def cpu_extra_buffer_types() -> dict[str, int]:
    """This build's extra CPU buffer types, name -> ggml_backend_buffer_type_t (AMX,
    CPU_REPACK, KLEIDIAI, ...), as llama.cpp's model loader asks for them."""
    from llama_cpp._ggml import libggml as lib

    init_backend()
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    dev = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not dev:
        return {}
    fn = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev), b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        return {}
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(dev)
    out: dict[str, int] = {}
    i = 0
    while bufts and bufts[i]:
        out[lib.ggml_backend_buft_name(bufts[i]).decode()] = bufts[i]
        i += 1
    return out


@functools.lru_cache(maxsize=1)
def cpu_features() -> dict[str, bool]:
    """The CPU features ggml-cpu was built for and checks when it picks a repack layout."""
    from llama_cpp._ggml import libggml_base_path

    names = ("avx2", "avx512", "neon", "dotprod", "matmul_int8", "sve")
    out = {name: False for name in names}
    for lib_name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll", "libggml.so"):
        path = libggml_base_path / lib_name
        if not path.exists():
            continue
        lib = ctypes.CDLL(str(path))
        for name in names:
            fn = getattr(lib, f"ggml_cpu_has_{name}", None)
            if fn is not None:
                fn.restype = ctypes.c_int
                out[name] = bool(fn())
        break
    return out


def kernel_path(config: EngineConfig, model_path: str) -> cpu_buffers.KernelPath:
    """The weight layout `config.cpu_buffers` means on this machine (may run the AMX probe once)."""
    choice = cpu_buffers.chosen(config.cpu_buffers)
    try:
        return cpu_buffers.resolve(choice, list(cpu_extra_buffer_types()),
                                   lambda: cpu_buffers.amx_verdict(model_path), config.deterministic)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


class _TensorBuftOverride(ctypes.Structure):
    """llama.h's struct llama_model_tensor_buft_override (llama-cpp-python declares the field
    as a void pointer and no struct)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


_pinned: dict[tuple[str, str], Any] = {}  # keeps each override array alive while llama.cpp may read it


def model_params(path: cpu_buffers.KernelPath, model_path: str) -> Any:
    """llama.cpp's default model parameters with the weight layout of `path`."""
    params = _default_model_params()
    params.use_extra_bufts = path.use_extra_bufts
    if path.pin_repack:
        params.tensor_buft_overrides = _repack_overrides(model_path)
    return params


def _repack_overrides(model_path: str) -> int:
    """A NULL-terminated llama_model_tensor_buft_override array pinning every weight ggml
    would repack here to CPU_REPACK (one exact-name pattern each); its address."""
    from ..models.gguf_header import read_tensor_infos
    from ..kernel_paths.repack_rule import repacked_names

    key = (model_path, json.dumps(sorted(cpu_features().items())))
    if key not in _pinned:
        buft = cpu_extra_buffer_types()[cpu_buffers.REPACK]
        names = repacked_names(read_tensor_infos(model_path), cpu_features())
        patterns = [ctypes.create_string_buffer(f"^{re_escape(n)}$".encode()) for n in names]
        array = (_TensorBuftOverride * (len(names) + 1))()
        for slot, pattern in zip(array, patterns):
            slot.pattern = ctypes.cast(pattern, ctypes.c_char_p)
            slot.buft = buft
        _pinned[key] = (array, patterns)
    return ctypes.addressof(_pinned[key][0])


def re_escape(name: str) -> str:
    """A tensor name as a std::regex (ECMAScript) literal: only '.' occurs in GGUF names."""
    return "".join("\\" + c if c in ".[](){}*+?^$|\\" else c for c in name)


def derive_shapes_for(model_path: str, buffers: dict[str, float]) -> invariance.Shapes:
    """Deterministic mode's row rule for this model on the kernels its weights took: the
    2-D weights' types, each marked repacked when the CPU_REPACK buffer holds weights and
    ggml's rule repacks that tensor here."""
    import platform

    from ..models.gguf_header import read_tensor_infos
    from ..kernel_paths.repack_rule import is_repacked

    repack_used = buffers.get(cpu_buffers.REPACK, 0.0) > 0
    features = cpu_features()
    types = [(t.ggml_type, repack_used and is_repacked(t, features))
             for t in read_tensor_infos(model_path) if len(t.dims) == 2]
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    return invariance.derive_shapes(types, x86)


@contextlib.contextmanager
def llama_uses_model_params(cpu_buffers_choice: str | None, model_path: str) -> Iterator[None]:
    """While active, llama-cpp-python's high-level `Llama` loads models with the weight
    layout `cpu_buffers_choice` means here (it has no option for it), so a baseline runs on
    the kernels the engine runs."""
    import llama_cpp.llama as high_level

    path = kernel_path(EngineConfig(model=model_path, cpu_buffers=cpu_buffers_choice), model_path)
    saved = high_level.llama_cpp.llama_model_default_params
    high_level.llama_cpp.llama_model_default_params = lambda: model_params(path, model_path)
    try:
        yield
    finally:
        high_level.llama_cpp.llama_model_default_params = saved


def high_level_llama(model_path: str, cpu_buffers_choice: str | None, **kwargs: Any) -> Any:
    """llama-cpp-python's high-level `Llama(model_path, **kwargs)` on the weight layout
    `cpu_buffers_choice` means here: `llamabatch bench --baseline` measures what a Python
    user has without llamabatch, on the kernels the engine runs."""
    import llama_cpp

    init_backend()  # keeps llama.cpp's log lines off stderr, as for the engine
    with llama_uses_model_params(cpu_buffers_choice, model_path):
        return llama_cpp.Llama(model_path, **kwargs)
