"""kernel_paths/ubatch_split.py against llama.cpp itself: graph runs counted with ggml's eval
callback (one call for the `result_output` tensor per graph computed) on the bundled model,
for both KV layouts and batches whose slot ids are consecutive, gapped, out of order, mixed."""
from __future__ import annotations

import ctypes
import os

import llama_cpp as C
import pytest

from llamabatch.config import EngineConfig
from llamabatch.llama.direct_load import load_weights
from llamabatch.kernel_paths.ubatch_split import ubatch_sizes

_ggml = ctypes.CDLL(os.path.join(os.path.dirname(C.__file__), "lib", "libggml-base.so"))
_ggml.ggml_get_name.restype = ctypes.c_char_p
_ggml.ggml_get_name.argtypes = [ctypes.c_void_p]

CASES = [
    [(s, 1) for s in range(6)],  # decode rows, consecutive slots
    [(0, 1), (1, 1), (3, 1), (4, 1)],  # a gap
    [(2, 1), (0, 1), (1, 1)],  # out of order
    [(0, 1), (1, 1), (2, 40)],  # decodes and a prefill
    [(0, 30), (1, 90)],  # two prefills
    [(4, 1), (0, 70), (5, 1), (1, 20)],  # everything at once
    [(0, 100), (1, 100)],  # more than n_ubatch
]
N_UBATCH = 64


@pytest.mark.model
@pytest.mark.parametrize("unified", [False, True], ids=["streams", "unified"])
def test_the_mirror_counts_the_graph_runs_llama_cpp_makes(model_path, unified):
    runs_seen = [0]

    @C.ggml_backend_sched_eval_callback
    def on_eval(tensor, ask, _user):
        if _ggml.ggml_get_name(tensor) == b"result_output":
            if not ask:
                runs_seen[0] += 1
            return True
        return False

    model = load_weights(model_path)  # the engine's layout: never an AMX that traps here
    cparams = C.llama_context_default_params()
    cparams.n_ctx, cparams.n_seq_max = 8 * 256, 8
    cparams.n_batch, cparams.n_ubatch = 512, N_UBATCH
    cparams.kv_unified = unified
    cparams.n_threads = cparams.n_threads_batch = EngineConfig().n_threads  # the CPUs this process may use
    cparams.cb_eval, cparams.cb_eval_user_data = on_eval, None
    ctx = C.llama_init_from_model(model, cparams)
    batch = C.llama_batch_init(512, 0, 1)
    try:
        for runs in CASES:
            C.llama_memory_clear(C.llama_get_memory(ctx), True)
            i = 0
            for seq_id, n in runs:
                for pos in range(n):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + pos, pos, 1
                    batch.seq_id[i][0], batch.logits[i] = seq_id, pos == n - 1
                    i += 1
            batch.n_tokens = i
            runs_seen[0] = 0
            assert C.llama_decode(ctx, batch) == 0
            C.llama_synchronize(ctx)
            assert runs_seen[0] == len(ubatch_sizes(runs, N_UBATCH, unified)), runs
    finally:
        C.llama_batch_free(batch)
        C.llama_free(ctx)
        C.llama_model_free(model)
