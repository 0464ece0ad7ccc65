"""Loading: the model file with a chosen weight layout, the context's parameters, the
context itself, and the GGUF metadata. Each failure is one ModelLoadError line naming
the first problem llama.cpp logged."""
from __future__ import annotations

import ctypes
from typing import Any

from llama_cpp import llama_cpp as C

from ..kernel_paths import batch_invariance as invariance
from .backend import first_error, weight_buffers
from .cpu_kernels import model_params
from ..config import EngineConfig
from ..errors import ModelLoadError
from ..models.gguf_header import GGUFError

# kv_cache_types.py's names as ggml's type ids (this llama_cpp has no constant for bf16: ggml.h's 30)
GGML_TYPES = {
    "f16": C.GGML_TYPE_F16, "bf16": getattr(C, "GGML_TYPE_BF16", 30), "q8_0": C.GGML_TYPE_Q8_0,
    "q4_0": C.GGML_TYPE_Q4_0, "q4_1": C.GGML_TYPE_Q4_1, "iq4_nl": C.GGML_TYPE_IQ4_NL,
    "q5_0": C.GGML_TYPE_Q5_0, "q5_1": C.GGML_TYPE_Q5_1,
}
FLASH_ATTN_TYPES = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                    "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def load_model(config: EngineConfig, model_path: str, kernels: Any, mark: int) -> tuple[Any, dict[str, float]]:
    """The loaded model (llama_model*) and the MiB of weights per buffer type it took
    (which layouts the weights really took, by use), from llama.cpp's log after `mark`."""
    try:
        mparams = model_params(kernels, model_path)
    except GGUFError as exc:
        # Pinning the repack layout reads the tensor table first (AMX built in but not usable):
        # a broken file fails here, before llama.cpp sees it, and must say so the same way.
        raise ModelLoadError(str(exc)) from None
    except OSError as exc:
        raise ModelLoadError(f"{model_path}: cannot read model file ({exc.strerror or exc})") from None
    mparams.n_gpu_layers = 999 if config.n_gpu_layers == -1 else config.n_gpu_layers
    model = C.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        raise ModelLoadError(f"{model_path}: llama.cpp could not load the model ({first_error(mark)})")
    return model, weight_buffers(mark)


def context_params(config: EngineConfig, shapes: invariance.Shapes | None, n_seq_ids: int) -> Any:
    """llama.cpp's context parameters for `config`; `shapes`: deterministic mode's row rule
    (None otherwise), with `n_seq_ids` sequence ids (the slots and the spare ones)."""
    cparams = C.llama_context_default_params()
    cparams.n_ctx = config.total_ctx
    cparams.n_batch = config.n_batch
    cparams.n_ubatch = config.n_batch
    cparams.n_seq_max = config.n_parallel
    cparams.type_k = GGML_TYPES[config.cache_type_k]
    cparams.type_v = GGML_TYPES[config.cache_type_v]
    cparams.flash_attn_type = FLASH_ATTN_TYPES[config.flash_attn]
    if shapes is not None:
        # The row rule for the kernels these weights really took (the CPU_REPACK buffer
        # holds weights or not), then spare sequence ids to pad decode passes (each id is
        # a KV stream of slot_ctx cells), room for the padding rows in every pass, and the
        # attention path known to be batch-invariant: flash attention off (config.validate
        # refuses "on" and any cache type but f16 here), one stream per sequence (below).
        cparams.n_seq_max = n_seq_ids
        cparams.n_ctx = config.slot_ctx * n_seq_ids
        rows = max(shapes.min_rows, shapes.tile)
        cparams.n_batch = cparams.n_ubatch = config.n_batch + rows * n_seq_ids
        cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.n_threads = config.n_threads
    cparams.n_threads_batch = config.n_threads
    # Always the full-size sliding-window cache (Gemma 3: 512 tokens). In a window cache of
    # window + one ubatch, llama.cpp writes a window layer's new cells over ones the window has
    # left, and the attention sums its cells in cell order: the logits then depend on where
    # earlier chunks went, which a pause (park and restore, an interrupted decode) changes, so a
    # preempted request answered differently (docs/reliability.md). Prefix reuse also trims
    # a slot back, which needs the cells before the window.
    cparams.swa_full = True
    # One KV stream per slot (default): each slot gets n_ctx / n_parallel cells and attends
    # only to its own cells. llama.cpp then splits a batch into ubatches of consecutive
    # slots with equal token counts, so a mixed prefill+decode tick is several graph runs.
    # A unified cache takes a whole tick in one graph run and shares forked cells instead
    # of copying them (see plan.Fork); config.kv_unified chooses (never with deterministic:
    # config.validate refuses it; the invariance rests on one stream per sequence).
    cparams.kv_unified = bool(config.kv_unified)
    cparams.no_perf = True
    return cparams


def new_context(model: Any, cparams: Any, config: EngineConfig, model_path: str, mark: int) -> Any:
    """The llama_context; on failure the model is freed and one ModelLoadError raised."""
    ctx = C.llama_init_from_model(model, cparams)
    if not ctx:
        C.llama_model_free(model)
        raise ModelLoadError(f"{model_path}: llama.cpp could not create a context of {config.total_ctx} tokens "
                             f"({first_error(mark)})")
    return ctx


def read_metadata(model: Any) -> dict[str, str]:
    """The GGUF's key/values, and its chat template under tokenizer.chat_template."""
    out = {}
    buf = ctypes.create_string_buffer(4096)
    for i in range(C.llama_model_meta_count(model)):
        n = C.llama_model_meta_key_by_index(model, i, buf, len(buf))
        key = buf.value.decode("utf-8", "replace") if n >= 0 else ""
        n = C.llama_model_meta_val_str_by_index(model, i, buf, len(buf))
        if key and n >= 0:
            out[key] = buf.value.decode("utf-8", "replace")
    template = C.llama_model_chat_template(model, None)
    if template:
        out["tokenizer.chat_template"] = template.decode("utf-8", "replace")
    return out
