"""Which weights ggml-cpu repacks into CPU_REPACK buffers on this CPU: a mirror of
`ggml_repack_get_optimal_repack_type` (ggml/src/ggml-cpu/repack.cpp in the llama.cpp that
llama-cpp-python 0.3.36 vendors), for x86 (AVX2 / AVX-512) and ARM NEON.

Why mirror it: with `cpu_buffers="repack"` the engine pins these tensors to CPU_REPACK by
name (llama.cpp's tensor_buft_overrides) with every other extra buffer type off, so a
machine whose build also has AMX can run the repacked kernels without AMX. A tensor pinned
there that ggml cannot repack would abort the load (GGML_ASSERT in set_tensor), so the rule
errs on the side of "no": SVE, RISC-V and s390 layouts are not mirrored (their tensors stay
plain), and a mismatch with llama.cpp's own choice shows in the test that compares both.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from ..models.gguf_header import TensorInfo

Q4_0, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4 = 2, 8, 10, 12, 13, 14, 20, 39

# ggml type -> [(features that must all be present, rows divisible by)] in the order ggml
# tries them: the first branch whose features are present and whose row count divides wins.
_RULES: dict[int, list[tuple[tuple[str, ...], int]]] = {
    Q4_0: [(("avx2",), 8), (("neon", "matmul_int8"), 4), (("neon", "dotprod"), 4)],
    Q4_K: [(("avx2",), 8), (("neon", "matmul_int8"), 8), (("neon", "dotprod"), 8)],
    Q2_K: [(("avx512",), 8)],
    Q5_K: [(("neon", "matmul_int8"), 8), (("neon", "dotprod"), 8)],
    Q6_K: [(("neon", "matmul_int8"), 8), (("neon", "dotprod"), 8)],
    IQ4_NL: [(("avx2",), 8), (("neon", "dotprod"), 4)],
    MXFP4: [(("avx2",), 8), (("neon", "dotprod"), 4)],
    Q8_0: [(("neon", "matmul_int8"), 4), (("neon", "dotprod"), 4)],
}


def is_repacked(tensor: TensorInfo, features: Mapping[str, bool]) -> bool:
    """Whether ggml would keep this weight in CPU_REPACK: a 2-D matrix used by a matmul (not
    the token embedding, which is read by row lookup) of a type with a layout for this CPU."""
    if len(tensor.dims) != 2 or not tensor.name.endswith(".weight") or "token_embd" in tensor.name:
        return False
    for needs, rows_multiple in _RULES.get(tensor.ggml_type, []):
        if all(features.get(f, False) for f in needs) and tensor.dims[1] % rows_multiple == 0:
            return True
    return False


def repacked_names(tensors: Iterable[TensorInfo], features: Mapping[str, bool]) -> list[str]:
    return [t.name for t in tensors if is_repacked(t, features)]
