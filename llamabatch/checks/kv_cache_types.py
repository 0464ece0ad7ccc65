"""The KV cache element types and flash-attention settings llama.cpp takes, and their sizes.

Names are llama.cpp's (`--cache-type-k q8_0`). Sizes are ggml's: a block of `block` values
stored in `bytes` bytes (ggml.c's type_traits: f16 and bf16 one value in 2 bytes; q8_0 32
values as one f16 scale + 32 int8 = 34 bytes; q4_0 one scale + 16 bytes of nibbles = 18;
q4_1 scale and minimum + 16 = 20; q5_0 scale + 4 bytes of high bits + 16 = 22; q5_1 24;
iq4_nl as q4_0, 18). llama.cpp sizes a layer's K row as ggml_row_size(type_k, n_embd_k_gqa),
and this file does the same, so what it counts is what llama.cpp allocates.

Pure Python (no llama_cpp import): EngineConfig and the memory checks use it before a model loads.
"""
from __future__ import annotations

# name -> (values per block, bytes per block)
BLOCKS: dict[str, tuple[int, int]] = {
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
CACHE_TYPES = tuple(BLOCKS)
DEFAULT_CACHE_TYPE = "f16"  # llama.cpp's default: unchanged numerics unless asked
FLASH_ATTN = ("auto", "on", "off")  # auto: llama.cpp decides per device (on for CPU)


def is_quantized(name: str) -> bool:
    """A block-quantized type. Without flash attention llama.cpp keeps V transposed, each
    cell's values written one per row, which a type packing 32 values per block cannot hold:
    a quantized V cache needs flash attention."""
    return BLOCKS[name][0] > 1


def row_bytes(name: str, values: int) -> int:
    """Bytes `values` elements of type `name` take in one row (ggml_row_size)."""
    block, size = BLOCKS[name]
    if values % block:
        raise ValueError(f"{name} stores rows in blocks of {block} values, not {values}")
    return values // block * size


def fits_rows(name: str, head_dim: int) -> bool:
    """Whether one attention head's row splits into whole blocks of `name` (llama.cpp views
    K and V head by head)."""
    return head_dim % BLOCKS[name][0] == 0


def pair_name(type_k: str, type_v: str) -> str:
    """How records and cache keys name a K/V pair: "f16/f16", "q8_0/q8_0"."""
    return f"{type_k}/{type_v}"
