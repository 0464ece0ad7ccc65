"""LlamaRunner: the one class callers use for llama.cpp (the Runner protocol in core/plan.py).

It owns the model, the context and one reusable llama_batch. Each tick it applies a
StepPlan's KV trims and forks, turns its chunks into exactly one llama_decode (or, in
deterministic mode, the passes batch_invariance.py shapes) and samples, inside llama.cpp,
the rows that asked for logits, each with the chain its chunk carries. Logits are never
copied into Python unless a request asked for logprobs, or its row is sampled apart from
the tick (a copy of one row, row_job.py).

The jobs around it have files of their own in this folder: load.py (model, context,
metadata), vocab.py, samplers.py (chains), kv.py (trims and forks), logprobs.py,
backend.py (llama.cpp's log), stderr_capture.py (the grammar parser's complaints),
cpu_kernels.py (CPU weight layouts), chat_formats.py. Only llama/ imports llama_cpp.
"""
from __future__ import annotations

import ctypes

import functools
from dataclasses import replace
import time
from typing import Any

from llama_cpp import llama_cpp as C

from ..kernel_paths import batch_invariance as invariance
from . import kv_state
from . import load
from ..kernel_paths import resources
from .backend import flash_attention, gpu_offload_supported, init_backend, kv_cache_mib, log_mark
from .chat_formats import LlamaChatFormats
from .decode_interrupt import DecodeInterrupt
from ..kernel_paths.cpu_buffers import KernelPath
from .cpu_kernels import derive_shapes_for, kernel_path
from .embedder import Embedder, default_pooling
from .kv import KvCache
from .sampling.logprobs import LogprobReporter
from .sampling.mask_grammar import chosen_backend
from .sampling.row_job import RowJob
from .sampling.chunk_sampling import ChunkSampler
from .invariant_decode import execute_invariant
from ..kernel_paths.ubatch_split import ubatch_sizes
from .sampling.samplers import Sampler, SamplerFactory, accept_written
from .vocab import Vocabulary
from ..config import EngineConfig
from ..checks.kv_cache_types import pair_name
from ..errors import DeterminismUnavailable
from ..params import SamplingParams
from ..core.plan import INTERRUPTED, EmbedBatch, EmbedStepResult, Restore, RunnerCapabilities, StepPlan, StepResult


class LlamaRunner:
    def __init__(self, config: EngineConfig, model_path: str, path: KernelPath | None = None):
        """`path`: the weight layout to load with; None resolves `config.cpu_buffers`."""
        init_backend()
        self.config = config
        self.model_path = model_path
        self._closed = False
        self.deterministic = config.deterministic
        if self.deterministic and gpu_offload_supported():
            # A GPU backend takes big matmuls even with n_gpu_layers=0 (op offload), with
            # kernels nobody has checked for batch invariance: refuse rather than promise.
            raise DeterminismUnavailable(
                "--deterministic needs a CPU-only llama.cpp build; this one can offload to a GPU, "
                "where llamabatch cannot promise batch-invariant output")
        resources.check_threads(config)  # before llama.cpp starts a thread pool (resources.py)
        self.kernels = path or kernel_path(config, model_path)
        mark = log_mark()
        self.model, self.weight_buffers = load.load_model(config, model_path, self.kernels, mark)
        self.vocab = Vocabulary(self.model)
        self.n_vocab = self.vocab.n_tokens
        self.bos_text, self.eos_text = self.vocab.bos_text, self.vocab.eos_text
        self.chat_formats = LlamaChatFormats()
        self.n_slots = config.n_parallel
        self.n_seq_ids = config.n_parallel
        self.shapes = invariance.DEFAULT
        if self.deterministic:
            # the row rule for the kernels the weights took, and spare sequence ids for padding
            self.shapes = derive_shapes_for(model_path, self.weight_buffers)
            self.n_seq_ids = invariance.n_sequence_ids(config.n_parallel, self.shapes)
        cparams = load.context_params(config, self.shapes if self.deterministic else None, self.n_seq_ids)
        self.kv_unified = bool(config.kv_unified)
        try:
            # The KV cache is allocated with the context, all at once: a size the machine cannot
            # hold is refused first, in one line (resources.py), with this model's metadata and,
            # in deterministic mode, the sequence ids and row rule really used.
            self.metadata = load.read_metadata(self.model)
            need = resources.check(config, model_path, metadata=self.metadata,
                                   shapes=self.shapes if self.deterministic else None)
        except BaseException:
            C.llama_model_free(self.model)
            raise
        self.ctx = load.new_context(self.model, cparams, config, model_path, mark)
        kv_can = self._read_kv_cache(config, cparams, mark, need)
        self.n_batch = cparams.n_batch
        self.n_ubatch = cparams.n_ubatch
        self.batch = C.llama_batch_init(self.n_batch, 0, 1)
        self._interrupt = DecodeInterrupt(self.ctx)
        # Rows may be sampled on sampling threads (sampling_threads.py); deterministic mode samples inline.
        # Decode chunks may carry guesses to verify (speculative decoding). Deterministic mode
        # pads each decode token with a row after it in its stream (batch_invariance.py): a
        # guess takes that row at no cost, and a slot takes no more rows than a pass pads.
        self.capabilities = replace(
            kv_can, can_sample_apart=not self.deterministic, can_verify=True,
            max_draft=invariance.max_decode_rows(self.shapes) - 1 if self.deterministic else None,
            free_draft=invariance.DECODE_ROWS - 1 if self.deterministic else 0,
            max_decode_rows=invariance.max_decode_rows(self.shapes) if self.deterministic else None)
        self.samplers = SamplerFactory(self.vocab, self.slot_ctx, chosen_backend(config.grammar_backend))  # windows clamp to the final slot_ctx
        self.logprobs = LogprobReporter(self.vocab)
        self.rows = ChunkSampler(self.ctx, self.n_vocab, self.logprobs, self.deterministic)
        # Embeddings run in a context of their own, made on first use (embedder.py says why).
        self.embedder = Embedder(self.model, config, self.deterministic, self.metadata,
                                 taken=need.total if need is not None else 0)
        self.n_embd = self.embedder.n_embd
        self.embed_max_tokens, self.embed_max_seqs = self.embedder.max_tokens, self.embedder.max_seqs
        self.default_pooling = config.pooling or default_pooling(self.metadata)
        self.embed_refusal = self.embedder.refusal
        if self.deterministic:
            from ..kernel_paths.determinism_check import check

            try:
                check(self)  # refuses, with one line naming the kernels, where the row rule does not hold
            except BaseException:
                self.close()
                raise

    def _read_kv_cache(self, config: EngineConfig, cparams: Any, mark: Any, need: Any) -> RunnerCapabilities:
        """The KV cache as the new context made it, and what this runner can do with it."""
        # the KV cache as llama.cpp made it: its types, its MiB by its own count, and whether
        # "auto" turned flash attention on (it decides V's layout in the cache, so saved KV's too)
        self.cache_types = pair_name(config.cache_type_k, config.cache_type_v)
        kv_mib = kv_cache_mib(mark)
        if kv_mib is None and need is not None:
            kv_mib = need.kv_bytes / 2**20
        resolved = flash_attention(mark)
        asked_off = cparams.flash_attn_type == C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.flash_attn = resolved if resolved is not None else not asked_off
        self.kv = KvCache(self.ctx, self.model, swa_full=cparams.swa_full, kv_unified=self.kv_unified)
        # A unified cache is one pool: a request may hold up to the model's trained context
        # (never less than an even share), and the scheduler admits it only when what it may
        # come to hold fits beside the others' (admission by room). A stream per slot holds
        # n_ctx / n_parallel cells each.
        self.slot_ctx = min(C.llama_n_ctx_seq(self.ctx), config.total_ctx // config.n_parallel)
        pool_cells = None
        if self.kv_unified:
            pool_cells = C.llama_n_ctx_seq(self.ctx)
            self.slot_ctx = min(pool_cells, max(self.slot_ctx, C.llama_model_n_ctx_train(self.model)))
        # A fork copies a slot's KV and trims the copy, and a Trim may keep part of a slot:
        # both only where the memory can keep part of a sequence (kv.py, plan.Fork, plan.Trim).
        # The disk prefix store needs the same (a restored slot's cells must be exactly what an
        # evaluated slot holds at its end); deterministic mode does not use it (kv_state.py says why).
        # A preempted request's whole sequence is snapshotted and put back to continue from its
        # end (what the store's restores do too, without the trims that need can_cut); the bytes
        # are the same, so deterministic mode keeps its bits.
        # What a restore brings back whole: every position of a model without window layers, and
        # of a sequence shorter than half the window. llama.cpp drops a window layer's cells only
        # once the window's mask hides them, and no window type (standard, chunked, or symmetric,
        # which keeps half on each side) hides positions that close. kv.trim checks it again.
        whole_below = self.kv.n_swa // 2 if self.kv.n_swa else (1 << 62)
        if self.deterministic:
            self.slot_ctx -= invariance.extra_cells(self.shapes)  # a final chunk's padding rows need cells
        return RunnerCapabilities(can_fork=self.kv.can_cut, can_trim=self.kv.can_cut,
                                  can_store=self.kv.can_cut and not self.deterministic, can_park=True,
                                  restored_whole_below=whole_below, pool_cells=pool_cells, kv_mib=kv_mib)

    # -- model facts -------------------------------------------------------------------

    @property
    def kernel_text(self) -> str:
        """"llama.cpp default kernels (cpu_buffers=auto: CPU_REPACK; weights: CPU_Mapped 235 MiB,
        CPU_REPACK 13 MiB)": the layout asked for and the buffers llama.cpp put the weights in."""
        from ..kernel_paths.determinism_check import describe_buffers

        kv_mib = self.capabilities.kv_mib
        kv = f"KV {self.cache_types}" + (f" {kv_mib:.1f} MiB" if kv_mib is not None else "")
        kv += " (flash attention on)" if self.flash_attn else " (flash attention off)"
        text = (f"{kv}, {self.kernels.name} kernels ({self.kernels.why}; "
                f"weights: {describe_buffers(self.weight_buffers)})")
        if self.deterministic:
            text += f"; deterministic rows: tiles of {self.shapes.tile}, at least {self.shapes.min_rows}"
        return text

    def tokenize(self, text: str, *, special: bool, add_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, special=special, add_special=add_special)

    def accept_forced(self, sampler: Sampler, tokens: list[int]) -> None:
        accept_written(sampler, tokens)

    def valid_guesses(self, sampler: Sampler, tokens: list[int]) -> int:
        return len(tokens) if sampler.matcher is None else sampler.matcher.valid_prefix(tokens)

    def graph_runs(self, runs: list[tuple[int, int]]) -> int:
        return len(ubatch_sizes(runs, self.n_ubatch, self.kv_unified))

    def token_bytes(self, token: int) -> bytes:
        return self.vocab.token_bytes(token)

    def token_piece(self, token: int) -> bytes:
        # a buffer of its own: called from a server's thread while the engine thread samples
        return self.vocab.piece(token, special=True, buf=ctypes.create_string_buffer(256))

    def longest_token_bytes(self) -> int | None:
        return self.vocab.longest_token_bytes

    def is_eog(self, token: int) -> bool:
        return self.vocab.is_eog(token)

    # -- samplers ----------------------------------------------------------------------

    def build_sampler(self, params: SamplingParams, seed: int) -> Sampler:
        return self.samplers.build(params, seed)

    def free_sampler(self, sampler: Sampler | None) -> None:
        self.samplers.free(sampler)

    # -- one tick ----------------------------------------------------------------------

    def interruptible(self, plan: StepPlan) -> bool:
        # llama.cpp undoes only the graph run it was computing; of a plan of several, the runs
        # done before are taken out here (_undo), where the memory allows (kv.can_undo).
        # Recurrent state is rewritten in place, so not even one run can be taken out again.
        # Deterministic mode's passes are several decodes.
        if not (self._interrupt.available and not self.deterministic and plan.chunks) or self.kv.cannot_cut_at_all:
            return False
        runs = [(c.slot, len(c.tokens)) for c in plan.chunks]
        return self.graph_runs(runs) == 1 or self.kv.can_undo([c.start_pos + len(c.tokens) for c in plan.chunks])

    def _undo(self, plan: StepPlan) -> None:
        """After an interrupted decode: every chunk's cells out again, the graph runs llama.cpp
        finished before the interrupt included (the one it stopped in, it took out itself)."""
        for chunk in plan.chunks:
            self.kv.drop_from(chunk.slot, chunk.start_pos)

    def interrupt(self) -> None:
        self._interrupt.stop()

    def clear_interrupt(self) -> None:
        self._interrupt.clear()

    def execute(self, plan: StepPlan) -> StepResult:
        # first: a slot trimmed here may be a fork's destination below
        emptied = {trim.slot for trim in plan.trims if not self.kv.trim(trim)}
        restored = {r.slot: self._restore(r) for r in plan.restores}
        for fork in plan.forks:
            if fork.src_slot in emptied or not self.kv.fork(fork):
                self.kv.drop_from(fork.dst_slot, -1)
                emptied.add(fork.dst_slot)
            else:
                emptied.discard(fork.dst_slot)  # the copy, not the trim before it, says what it holds
        for move in plan.moves:  # after the forks: no slot a move touches is in any other change
            if move.src_slot in emptied or not self.kv.move(move):
                self.kv.drop_from(move.dst_slot, -1)
                emptied.add(move.dst_slot)
        # trims, restores, forks and moves applied above: the first llama_decode performs the copies
        plan = plan.without_slots(emptied)
        result = execute_invariant(self, plan) if self.deterministic else self._execute_chunks(plan)
        result.restored = restored
        result.emptied = emptied
        return result

    def _execute_chunks(self, plan: StepPlan) -> StepResult:
        t_fill = time.perf_counter()
        batch = self.batch
        token, pos, n_seq, seq_ids, want = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        rows: list[tuple[Any, int]] = []  # (chunk, row)
        i = 0
        for chunk in plan.chunks:
            slot, p0 = chunk.slot, chunk.start_pos
            for j, tok in enumerate(chunk.tokens):
                token[i] = tok
                pos[i] = p0 + j
                n_seq[i] = 1
                seq_ids[i][0] = slot
                want[i] = 0
                i += 1
            if chunk.wants_logits:
                for r in range(i - 1 - chunk.n_draft, i):  # a verified chunk: its guesses' rows too
                    want[r] = 1
                rows.append((chunk, i - 1))
        batch.n_tokens = i
        if i == 0:  # trims and forks only: llama.cpp performs the queued copies at the next decode
            return StepResult()
        t0 = time.perf_counter()
        status = C.llama_decode(self.ctx, batch)
        C.llama_synchronize(self.ctx)
        t1 = time.perf_counter()
        result = StepResult(status=status, eval_ms=(t1 - t0) * 1000, fill_ms=(t0 - t_fill) * 1000,
                            ubatches=len(ubatch_sizes([(c.slot, len(c.tokens)) for c in plan.chunks],
                                                      self.n_ubatch, self.kv_unified)))
        if status == INTERRUPTED:
            self._undo(plan)
        if status != 0:
            return result
        for chunk, row in rows:
            if chunk.sample_apart and self.capabilities.can_sample_apart:
                result.apart[chunk.slot] = RowJob(self, chunk, row)  # copies the row: the next decode overwrites it
            elif chunk.n_draft:
                self.rows.verify(chunk, row, result)
            else:
                self.rows.sample(chunk, row, result)
        result.sample_ms = (time.perf_counter() - t1) * 1000
        return result

    def _restore(self, restore: Restore) -> bool:
        if not kv_state.restore(self.ctx, restore.slot, restore.payload):
            return False
        if self.kv.next_pos(restore.slot) == restore.n_tokens:
            return True
        self.kv.drop_from(restore.slot, -1)  # not the entry it said it was: evaluate instead
        return False

    def keep_floor(self, slot: int) -> int:
        return self.kv.keep_floor(slot)

    def snapshot(self, slot: int) -> bytearray:
        return kv_state.snapshot(self.ctx, slot)

    @functools.cached_property
    def kv_fingerprint(self) -> dict[str, str]:
        """What must be the same for KV bytes saved by one process to be restored by another:
        the model's content, the llama.cpp build, and the cache's layout and types."""
        return kv_state.fingerprint(self.model_path, self.model, kv_unified=self.kv_unified,
                                    swa_full=self.kv.swa_full, kernels=self.kernels.name,
                                    cache_types=self.cache_types, flash_attn=self.flash_attn)

    def embed(self, batch: EmbedBatch) -> EmbedStepResult:
        return self.embedder.run(batch)

    def close(self) -> None:
        """Free everything exactly once, whatever happens after."""
        if self._closed:
            return
        self._closed = True
        self.embedder.close()  # its contexts use the model: before it goes
        C.llama_batch_free(self.batch)
        C.llama_free(self.ctx)
        C.llama_model_free(self.model)
