"""A model loaded outside the engine, for tests and benchmarks that drive llama.cpp themselves:
its weights on the layout the project's kernel-path choice gives (`cpu_buffers`, as the
engine loads them), or its vocabulary alone.

llama.cpp's default model parameters take every extra buffer type of the build, AMX included
where it is built in; a CPU (a VM) can list AMX and still trap its tile instructions, and then
the process that loaded the weights dies. The engine's choice probes AMX in a throwaway process
first, so every load of weights goes through it: here, the engine's load.py, and cpu_kernels.py's
high-level `Llama`. tests/test_weight_loading_paths.py checks that nothing else in the tree
hands llama.cpp its defaults.
"""
from __future__ import annotations

from typing import Any

from llama_cpp import llama_cpp as C

from .backend import first_error, init_backend, log_mark
from ..kernel_paths.cpu_buffers import KernelPath
from .cpu_kernels import kernel_path, model_params
from .load import load_model
from ..config import EngineConfig
from ..errors import ModelLoadError

# A vocabulary-only load reads no tensor data, so no kernel ever runs on it: any layout will do.
_NO_WEIGHTS = KernelPath("plain", False, False, "vocabulary only")


def weights_kernel_path(model_path: str, cpu_buffers: str | None = None) -> KernelPath:
    """The weight layout `cpu_buffers` (None: $LLAMABATCH_CPU_BUFFERS, else auto) means here
    for this model; may run the AMX probe once, in a throwaway process."""
    init_backend()
    return kernel_path(EngineConfig(model=model_path, cpu_buffers=cpu_buffers), model_path)


def load_weights(model_path: str, cpu_buffers: str | None = None) -> Any:
    """The model (llama_model*, free it with llama_model_free) with its weights on the layout
    `weights_kernel_path` gives. Raises ModelLoadError with llama.cpp's first logged problem."""
    kernels = weights_kernel_path(model_path, cpu_buffers)
    model, _buffers = load_model(EngineConfig(model=model_path, cpu_buffers=cpu_buffers), model_path, kernels,
                                 log_mark())
    return model


def load_vocabulary(model_path: str) -> Any:
    """The model's vocabulary alone (llama.cpp's vocab_only: no weights, no kernels), as a
    llama_model* to free with llama_model_free. Raises ModelLoadError."""
    init_backend()
    mark = log_mark()
    params = model_params(_NO_WEIGHTS, model_path)
    params.vocab_only = True
    model = C.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise ModelLoadError(f"{model_path}: llama.cpp could not load its vocabulary ({first_error(mark)})")
    return model
