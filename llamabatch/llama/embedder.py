"""Embeddings: a second llama_context on the already loaded model, with embeddings on.

Why a context of its own rather than llama_set_embeddings on the generation context (as
llama-server toggles it per batch), from llama.cpp's sources (src/llama-context.cpp):
- the pooling type is fixed when a context is created (cparams.pooling_type): the
  generation context pools nothing (NONE for a causal LM), and pooled vectors
  (llama_get_embeddings_seq) need MEAN/CLS/LAST there;
- with embeddings on, every token of the batch is an output (`output_all`): a generation
  tick riding along would get logits for each prompt token and an output buffer of
  n_batch x n_vocab floats in the generation context for the rest of its life;
- every input is a sequence of its own: in the generation context that is a slot (one KV
  stream of slot_ctx cells each, n_parallel of them), so an embedding batch would hold the
  slots generation needs; here one unified cache of n_batch cells holds up to 256 short
  sequences (LLAMA_MAX_SEQ) and is cleared after each batch.
The price: the context's own buffers (KV for n_batch tokens, and, for a causal LM, the
output rows: n_batch x n_vocab floats, as llama-server pays), allocated on first use only.

Two ways to a vector, by model:
- an embedding model (its GGUF names a pooling type): llama.cpp pools (one context per
  pooling type asked for; llama_get_embeddings_seq), with whatever its graph adds after
  pooling (dense projections, a classifier);
- a generative LM (no pooling type: the bundled Gemma 3, most GGUFs): the graph would end in
  the vocabulary projection, logits for every token (with embeddings on, every token is an
  output), which no embedding reads: for Gemma 3 270M's 262,144-token vocabulary that is
  more arithmetic than the whole transformer. Here the context pools nothing (NONE), an
  eval callback stops the graph once the final norm's per-token states are computed (the
  node build_pooling names "result_embd_pooled"), llama.cpp copies those states out as it
  does for NONE, and mean/cls/last pooling happens here in numpy: the same states
  llama-server pools, about twice as fast on CPU (cosine with llama.cpp's own mean pooling
  0.9999999). Where the node is not found the graph simply runs to the end.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as C

from ..config import EngineConfig
from ..errors import ResourceLimit
from ..kernel_paths import resources
from ..core.plan import EmbedBatch, EmbedStepResult

LLAMA_MAX_SEQ = 256  # llama-cparams.h: sequence ids of one context
POOLING_TYPES = {"mean": C.LLAMA_POOLING_TYPE_MEAN, "cls": C.LLAMA_POOLING_TYPE_CLS,
                 "last": C.LLAMA_POOLING_TYPE_LAST}
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}  # "{arch}.pooling_type" in the GGUF
CONTEXT_FAILED = -100  # EmbedStepResult.status when the embedding context cannot be made
UBATCH = 512  # graph-run size of a generative LM's embedding context (llama-server's -ub default)
STOP_NODE = b"result_embd_pooled"  # with pooling NONE: the final norm's output, per token (llama-graph.cpp)


def _ggml_get_name() -> Any:
    """ggml_get_name from llama-cpp-python's own libggml-base (None where it is not found:
    then the graph runs to the end, only slower)."""
    folder = os.path.join(os.path.dirname(C.__file__), "lib")
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                return None
            fn = lib.ggml_get_name
            fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
            return fn
    return None


def has_own_pooling(metadata: dict[str, str]) -> bool:
    arch = metadata.get("general.architecture", "")
    return f"{arch}.pooling_type" in metadata


def default_pooling(metadata: dict[str, str]) -> str:
    """The pooling a request that names none gets: the GGUF's own type, else mean ("rank" for a
    reranker, which gives scores, not vectors: core/embedding.py refuses it by name)."""
    arch = metadata.get("general.architecture", "")
    try:
        kind = GGUF_POOLING.get(int(metadata.get(f"{arch}.pooling_type", "0")), "")
    except ValueError:
        kind = ""
    return kind or "mean"


class Embedder:
    """The embedding contexts (one per pooling type, made on first use) and their batch."""

    def __init__(self, model: Any, config: EngineConfig, deterministic: bool, metadata: dict[str, str],
                 taken: int = 0):
        self.model = model
        self.metadata = metadata
        self.taken = taken  # bytes the engine took already (its KV cache and weights): resources.check_addition
        # A generative LM: llama.cpp gives per-token states, pooled here (the module docstring)
        self.pool_here = not has_own_pooling(metadata)
        self._get_name = _ggml_get_name() if self.pool_here else None
        self._callback = C.ggml_backend_sched_eval_callback(self._stop_after_states)  # kept alive with self
        self.stops = 0  # graphs stopped before the vocabulary projection (for tests and the note)
        self.config = config
        self.deterministic = deterministic
        self.n_embd = C.llama_model_n_embd_out(model)
        self.max_tokens = config.n_batch
        # Deterministic mode: one input per llama_decode, so a vector never depends on what else
        # was submitted (the row shapes of a batch change the CPU kernels' rounding).
        self.max_seqs = 1 if deterministic else min(LLAMA_MAX_SEQ, config.n_batch)
        self.contexts: dict[str, Any] = {}
        self.batch: Any = None
        self.refusal = ""
        if C.llama_model_has_encoder(model) and C.llama_model_has_decoder(model):
            self.refusal = "embeddings from encoder-decoder models are not supported"

    def _stop_after_states(self, tensor: Any, ask: bool, _user: Any) -> bool:
        # ask: "do you want this node's data?" (yes only for the states); then False stops the graph
        if ask:
            return self._get_name(tensor) == STOP_NODE
        self.stops += 1
        return False

    def context(self, pooling: str) -> Any:
        if self.pool_here:
            pooling = "none"  # one context: every pooling is done here
        ctx = self.contexts.get(pooling)
        if ctx is not None:
            return ctx
        p = C.llama_context_default_params()
        # The cache is emptied after every batch: it holds one batch, all of it (an input is
        # never split over two llama_decode calls).
        p.n_ctx = p.n_batch = p.n_ubatch = self.max_tokens
        if self.pool_here:
            # A causal LM may evaluate a batch in several graph runs (the cache keeps what came
            # before): the compute buffer then holds UBATCH rows of n_vocab floats, not n_batch.
            # (Non-causal embedding models need the whole batch in one ubatch.)
            p.n_ubatch = min(self.max_tokens, UBATCH)
        p.n_seq_max = self.max_seqs
        p.kv_unified = True  # the sequences share n_batch cells, however long each one is
        p.embeddings = True
        if self.pool_here:
            p.pooling_type = C.LLAMA_POOLING_TYPE_NONE
            if self._get_name is not None:
                p.cb_eval, p.cb_eval_user_data = self._callback, None
        else:
            p.pooling_type = POOLING_TYPES[pooling]
        p.n_threads = p.n_threads_batch = self.config.n_threads
        if self.deterministic:
            p.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED  # the attention path checked for invariance
        p.no_perf = True
        # ResourceLimit when it does not fit: every embedding request gets that error, generation goes on
        resources.check_addition(self.config, self.reserved_bytes(p.n_ctx, p.n_ubatch), self.taken,
                                 "the embedding context")
        ctx = C.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create an embedding context of {self.max_tokens} tokens")
        if self.batch is None:
            self.batch = C.llama_batch_init(self.max_tokens, 0, 1)
        self.contexts[pooling] = ctx
        return ctx

    def reserved_bytes(self, cells: int, ubatch: int) -> int:
        """What llama.cpp reserves for an embedding context (its log's buffer sizes): KV for its
        cells, output rows of f32 for every sequence id, and for a causal LM the vocabulary's
        logits: n_vocab per output row and, in the compute buffer, per row of a ubatch (reserved
        though the graph stops before them: about 780 MiB for Gemma 3 at n_batch 512)."""
        per_token = resources.kv_bytes_per_token(self.metadata) or 0
        n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(self.model)) if self.pool_here else 0
        return cells * per_token + 4 * (self.max_seqs * (self.n_embd + n_vocab) + ubatch * n_vocab)

    def run(self, plan: EmbedBatch) -> EmbedStepResult:
        t0 = time.perf_counter()
        try:
            ctx = self.context(plan.pooling)
        except ResourceLimit as exc:
            return EmbedStepResult(status=CONTEXT_FAILED, error=str(exc), code=ResourceLimit.code)
        except RuntimeError as exc:
            return EmbedStepResult(status=CONTEXT_FAILED, error=str(exc))
        batch = self.batch
        i = 0
        for seq, tokens in enumerate(plan.inputs):
            for pos, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 1  # pooling reads every token's output
                i += 1
        batch.n_tokens = i
        status = C.llama_decode(ctx, batch)
        C.llama_synchronize(ctx)
        result = EmbedStepResult(status=status)
        if status == 0 and self.pool_here:
            result.vectors = self._pool(ctx, plan)
        elif status == 0:
            n = self.n_embd
            for seq in range(len(plan.inputs)):
                ptr = C.llama_get_embeddings_seq(ctx, seq)
                if not ptr:
                    result = EmbedStepResult(status=CONTEXT_FAILED, error=f"llama.cpp gave no pooled vector for input {seq}")
                    break
                result.vectors.append(ptr[:n])
        memory = C.llama_get_memory(ctx)
        if memory:  # models without a KV cache (non-causal encoders) have none to clear
            C.llama_memory_clear(memory, True)
        result.eval_ms = (time.perf_counter() - t0) * 1000
        return result

    def _pool(self, ctx: Any, plan: EmbedBatch) -> list[list[float]]:
        """Each input's vector from the per-token states llama.cpp copied out (pooling NONE:
        one row of n_embd floats per token, in batch order): their mean, first or last row."""
        n_rows = plan.n_tokens
        states = np.ctypeslib.as_array(C.llama_get_embeddings(ctx), shape=(n_rows * self.n_embd,))
        states = states.reshape(n_rows, self.n_embd)
        vectors = []
        row = 0
        for tokens in plan.inputs:
            rows = states[row:row + len(tokens)]
            if plan.pooling == "cls":
                vectors.append(rows[0].tolist())
            elif plan.pooling == "last":
                vectors.append(rows[-1].tolist())
            else:
                vectors.append(rows.mean(axis=0, dtype=np.float64).tolist())
            row += len(tokens)
        return vectors

    def close(self) -> None:
        for ctx in self.contexts.values():
            C.llama_free(ctx)
        self.contexts.clear()
        if self.batch is not None:
            C.llama_batch_free(self.batch)
            self.batch = None
