"""LlamaRunner: the module that imports llama_cpp (with row_job.py, which it imports).

It owns the model, the context and one reusable llama_batch, and builds each request's
sampler chain. Each tick it turns a StepPlan into exactly one llama_decode and samples,
inside llama.cpp, the rows that asked for logits, each with the chain its chunk carries. Logits are never copied into Python unless a
request asked for logprobs, or its row is sampled apart from the tick (a copy of one row,
row_job.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any, Iterator

import llama_cpp
from llama_cpp import llama_cpp as C

from . import batch_invariance as invariance
from . import cpu_buffers, resources
from ..config import EngineConfig
from ..errors import DeterminismUnavailable, InvalidRequest, ModelLoadError
from ..params import SamplingParams
from ..core.plan import Fork, StepPlan, StepResult
from .row_job import RowJob

log = logging.getLogger("llamabatch.runner")

# llama.cpp logs a lot to stderr; keep the last lines so a load failure can name its cause,
# and forward them to Python logging (shown with --debug) instead of printing.
_recent_log: deque[tuple[int, str]] = deque(maxlen=40)  # (line number, text)
_log_count = itertools.count(1)
# "<buffer type> model buffer size = N MiB" lines, kept apart: a load logs hundreds of lines
_buffer_log: deque[tuple[int, str]] = deque(maxlen=64)
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
        log.log(_GGML_LEVELS.get(level, logging.DEBUG), "%s", line)


_backend_lock = threading.Lock()
_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            C.llama_log_set(_log_callback, ctypes.c_void_p(0))
            C.llama_backend_init()
            _backend_ready = True


class _Sampler:
    """A request's sampler chain (and, for min_tokens, a twin that cannot pick end-of-generation)."""

    def __init__(self, chain: Any, no_eog_chain: Any, seed: int):
        self.chain = chain
        self.no_eog_chain = no_eog_chain
        self.seed = seed


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...)."""
    return bool(C.llama_supports_gpu_offload())


class LlamaRunner:
    def __init__(self, config: EngineConfig, model_path: str, path: "cpu_buffers.KernelPath | None" = None):
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
        mparams = model_params(self.kernels, model_path)
        mparams.n_gpu_layers = 999 if config.n_gpu_layers == -1 else config.n_gpu_layers
        mark = _log_mark()
        self.model = C.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"{model_path}: llama.cpp could not load the model ({_first_error(mark)})")
        self.weight_buffers = weight_buffers(mark)  # which layouts the weights took, by use
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.n_slots = config.n_parallel
        cparams = C.llama_context_default_params()
        cparams.n_ctx = config.total_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = config.n_parallel
        self.n_seq_ids = config.n_parallel
        self.shapes = invariance.DEFAULT
        if self.deterministic:
            # The row rule for the kernels these weights really took (the CPU_REPACK buffer
            # holds weights or not), then spare sequence ids to pad decode passes (each id is
            # a KV stream of slot_ctx cells), room for the padding rows in every pass, and the
            # attention path known to be batch-invariant: flash attention off, one stream per
            # sequence (below).
            self.shapes = derive_shapes_for(model_path, self.weight_buffers)
            self.n_seq_ids = invariance.n_sequence_ids(config.n_parallel, self.shapes)
            cparams.n_seq_max = self.n_seq_ids
            cparams.n_ctx = config.slot_ctx * self.n_seq_ids
            rows = max(self.shapes.min_rows, self.shapes.tile)
            cparams.n_batch = cparams.n_ubatch = config.n_batch + rows * self.n_seq_ids
            cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.n_threads = config.n_threads
        cparams.n_threads_batch = config.n_threads
        # Prefix reuse trims a slot's KV back to the shared prefix. With a sliding-window
        # cache (Gemma 3: 512 tokens) cells before the window are gone even though seq_rm
        # reports success, so keep the full-size SWA cache whenever caching is on.
        cparams.swa_full = bool(config.cache_prompt) or self.deterministic  # padding rows are trimmed too
        # One KV stream per slot (default): each slot gets n_ctx / n_parallel cells and attends
        # only to its own cells. llama.cpp then splits a batch into ubatches of consecutive
        # slots with equal token counts, so a mixed prefill+decode tick is several graph runs.
        # A unified cache takes a whole tick in one graph run and shares forked cells instead
        # of copying them (see plan.Fork); config.kv_unified chooses (never with deterministic:
        # config.validate refuses it; the invariance rests on one stream per sequence).
        cparams.kv_unified = bool(config.kv_unified)
        self.kv_unified = bool(config.kv_unified)
        cparams.no_perf = True
        try:
            # The KV cache is allocated with the context, all at once: a size the machine cannot
            # hold is refused first, in one line (resources.py), with this model's metadata and,
            # in deterministic mode, the sequence ids and row rule really used.
            self.metadata = self._read_metadata()
            resources.check(config, model_path, metadata=self.metadata,
                            shapes=self.shapes if self.deterministic else None)
        except BaseException:
            C.llama_model_free(self.model)
            raise
        self.ctx = C.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            C.llama_model_free(self.model)
            raise ModelLoadError(f"{model_path}: llama.cpp could not create a context of {config.total_ctx} tokens "
                                 f"({_first_error(mark)})")
        self.mem = C.llama_get_memory(self.ctx)
        # a unified cache lets one sequence use all of it: keep the per-slot share as the cap,
        # so the slots together never need more cells than there are
        self.slot_ctx = min(C.llama_n_ctx_seq(self.ctx), config.total_ctx // config.n_parallel)
        # A fork copies a slot's KV and trims the copy; recurrent and hybrid memories cannot
        # trim part of a sequence, and without the full-size SWA cache the copy may lack the
        # sliding window's early cells (see plan.Fork).
        self.can_fork = bool((cparams.swa_full or C.llama_model_n_swa(self.model) == 0)
                             and not C.llama_model_is_recurrent(self.model) and not C.llama_model_is_hybrid(self.model))
        if self.deterministic:
            self.slot_ctx -= invariance.extra_cells(self.shapes)  # a final chunk's padding rows need cells
        self.n_batch = cparams.n_batch
        self.batch = C.llama_batch_init(self.n_batch, 0, 1)
        # Rows may be sampled on sampling threads (apart.py); deterministic mode samples inline.
        self.can_sample_apart = not self.deterministic
        self._piece_cache: dict[int, bytes] = {}
        self._lp_tokens: dict[int, tuple[str, list[int]]] = {}  # token -> (text, bytes) for logprobs
        self._lp_scratch: Any = None  # a float32 buffer of n_vocab, made on the first logprobs request
        self._piece_buf = ctypes.create_string_buffer(256)
        # the text of BOS/EOS, for chat templates that mention them
        self.bos_text = self.token_text(C.llama_vocab_bos(self.vocab)) if C.llama_vocab_bos(self.vocab) >= 0 else ""
        self.eos_text = self.token_text(C.llama_vocab_eos(self.vocab)) if C.llama_vocab_eos(self.vocab) >= 0 else ""
        if self.deterministic:
            from .determinism_check import check

            try:
                check(self)  # refuses, with one line naming the kernels, where the row rule does not hold
            except BaseException:
                self.close()
                raise

    # -- model facts -------------------------------------------------------------------

    @property
    def kernel_text(self) -> str:
        """"llama.cpp default kernels (cpu_buffers=auto: CPU_REPACK; weights: CPU_Mapped 235 MiB,
        CPU_REPACK 13 MiB)": the layout asked for and the buffers llama.cpp put the weights in."""
        from .determinism_check import describe_buffers

        text = f"{self.kernels.name} kernels ({self.kernels.why}; weights: {describe_buffers(self.weight_buffers)})"
        if self.deterministic:
            text += f"; deterministic rows: tiles of {self.shapes.tile}, at least {self.shapes.min_rows}"
        return text

    def _read_metadata(self) -> dict[str, str]:
        out = {}
        buf = ctypes.create_string_buffer(4096)
        for i in range(C.llama_model_meta_count(self.model)):
            n = C.llama_model_meta_key_by_index(self.model, i, buf, len(buf))
            key = buf.value.decode("utf-8", "replace") if n >= 0 else ""
            n = C.llama_model_meta_val_str_by_index(self.model, i, buf, len(buf))
            if key and n >= 0:
                out[key] = buf.value.decode("utf-8", "replace")
        template = C.llama_model_chat_template(self.model, None)
        if template:
            out["tokenizer.chat_template"] = template.decode("utf-8", "replace")
        return out

    def token_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", "replace")

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), arr, cap, True, special)
        if n < 0:
            arr = (C.llama_token * -n)()
            n = C.llama_tokenize(self.vocab, data, len(data), arr, -n, True, special)
        return list(arr[:n])

    def _piece(self, token: int, special: bool, buf: Any = None) -> bytes:
        """`buf`: a 256-byte buffer of the caller's own (a sampling thread must not share ours)."""
        buf = buf if buf is not None else self._piece_buf
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            return buf.raw[:n]
        return buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        # Pieces of generated text; control tokens render as nothing (special=False).
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token, special=False)
        return piece

    @functools.cached_property
    def _eog_ids(self) -> tuple[int, ...]:
        # Only chains that ban end-of-generation (ignore_eos, min_tokens) need the full list,
        # and scanning a 262,144-token vocabulary costs ~70 ms: not at every model load.
        return tuple(t for t in range(self.n_vocab) if C.llama_vocab_is_eog(self.vocab, t))

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    # -- samplers ----------------------------------------------------------------------

    def build_sampler(self, params: SamplingParams, seed: int) -> _Sampler:
        # A grammar decides where output ends: once it is complete it allows only EOG, and
        # banning EOG there (ignore_eos, min_tokens) leaves no valid token at all, which makes
        # llama.cpp's grammar throw and abort the whole process. So constrained requests
        # never ban EOG; an EOG they sample ends them with "stop".
        constrained = bool(params.grammar) or params.json_schema is not None
        chain = self._chain(params, seed, block_eog=params.ignore_eos and not constrained)
        no_eog = (self._chain(params, seed, block_eog=True)
                  if params.min_tokens > 0 and not params.ignore_eos and not constrained else None)
        return _Sampler(chain, no_eog, seed)

    def _chain(self, p: SamplingParams, seed: int, block_eog: bool) -> Any:
        sparams = C.llama_sampler_chain_default_params()
        sparams.no_perf = True
        chain = C.llama_sampler_chain_init(sparams)
        add = lambda s: C.llama_sampler_chain_add(chain, s)  # noqa: E731
        try:
            grammar = p.grammar
            if p.json_schema is not None:
                schema = p.json_schema if isinstance(p.json_schema, str) else json.dumps(p.json_schema)
                try:
                    grammar = llama_cpp.llama_grammar.json_schema_to_gbnf(schema)
                except Exception as exc:  # the converter raises many kinds for bad schemas
                    raise InvalidRequest(f"json_schema cannot be turned into a grammar: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
            if grammar:
                mark = _log_mark()
                with _stderr_captured() as said:  # the parser prints its complaint with fprintf(stderr)
                    g = C.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
                if not g:
                    raise InvalidRequest(f"grammar does not parse ({_grammar_complaint(said) or _first_error(mark)})")
                add(g)
            bias = dict(p.logit_bias)
            if p.grammar or p.json_schema is not None:
                # Under a grammar, a -inf bias on every token the grammar allows (EOG once it is
                # complete, or the one character it wants) leaves no token at all, and llama.cpp's
                # grammar then throws and aborts the process (found by benchmarks/fuzz_sampling.py).
                # So there a ban is a very strong dislike: picked only when nothing else is allowed.
                bias = {t: max(b, GRAMMAR_BAN) for t, b in bias.items()}
            if block_eog:
                bias.update({t: -math.inf for t in self._eog_ids})
            if bias:
                bad = [t for t in bias if t >= self.n_vocab]
                if bad:
                    raise InvalidRequest(f"logit_bias token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
                arr = (C.llama_logit_bias * len(bias))(*[C.llama_logit_bias(t, b) for t, b in bias.items()])
                add(C.llama_sampler_init_logit_bias(self.n_vocab, len(bias), arr))
            if p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
                # this llama.cpp takes n_vocab first; -1 means the whole slot (llama.cpp itself
                # would read -1 as 0, i.e. penalties off). A window longer than the slot can't hold
                # more tokens than the slot does, and llama.cpp allocates the whole window up front.
                last_n = self._window(p.penalty_last_n)
                add(C.llama_sampler_init_penalties(self.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty,
                                                   p.presence_penalty))
            if p.dry_multiplier > 0:
                breakers = [b.encode() for b in p.dry_sequence_breakers]
                arr = (ctypes.c_char_p * len(breakers))(*breakers)
                # -1 is "the whole slot" (llama.cpp's own init reads -1 as 0: DRY silently off), and a
                # longer window is clamped to the slot as for the penalties above.
                add(C.llama_sampler_init_dry(self.vocab, p.dry_multiplier, p.dry_base,
                                             min(p.dry_allowed_length, self.slot_ctx),
                                             self._window(p.dry_penalty_last_n), arr, len(breakers)))
            if p.greedy:
                add(C.llama_sampler_init_greedy())
            elif p.mirostat == 2:
                add(C.llama_sampler_init_temp(p.temperature))
                add(C.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
            else:
                if p.top_n_sigma > 0:
                    add(C.llama_sampler_init_top_n_sigma(p.top_n_sigma))
                if p.top_k > 0:
                    add(C.llama_sampler_init_top_k(min(p.top_k, self.n_vocab)))  # int32 in C
                if p.typical_p < 1.0:
                    add(C.llama_sampler_init_typical(p.typical_p, 1))
                if p.top_p < 1.0:
                    add(C.llama_sampler_init_top_p(p.top_p, 1))
                if p.min_p > 0:
                    add(C.llama_sampler_init_min_p(p.min_p, 1))
                if p.xtc_probability > 0:
                    add(C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1, seed))
                add(C.llama_sampler_init_temp(p.temperature))
                add(C.llama_sampler_init_dist(seed))
        except BaseException:
            C.llama_sampler_free(chain)
            raise
        return chain

    def _window(self, last_n: int) -> int:
        """A penalty window in tokens: -1 and anything longer than a slot mean the whole slot."""
        return self.slot_ctx if last_n < 0 else min(last_n, self.slot_ctx)

    def free_sampler(self, sampler: _Sampler | None) -> None:
        if sampler is None:
            return
        C.llama_sampler_free(sampler.chain)
        if sampler.no_eog_chain:
            C.llama_sampler_free(sampler.no_eog_chain)

    # -- KV cache ----------------------------------------------------------------------

    def keep_prefix(self, slot: int, n_keep: int) -> int:
        if n_keep > 0 and C.llama_memory_seq_rm(self.mem, slot, n_keep, -1):
            # Trust, but verify: a sliding-window cache can report success after the cells
            # the continuation needs have already been evicted.
            if C.llama_memory_seq_pos_min(self.mem, slot) <= 0:
                return n_keep
        # Partial trims unsupported (recurrent/hybrid models) or the prefix is gone: reset.
        C.llama_memory_seq_rm(self.mem, slot, -1, -1)
        return 0

    def fork(self, fork: Fork) -> None:
        """Apply one plan.Fork (its docstring is the contract). Between per-slot streams:
        copy the source's whole stream, then trim the copy (llama.cpp queues the copy and
        does it at the start of the next llama_decode, before that decode's tokens are
        placed). In a unified cache: share the source's cells [0, n_tokens)."""
        if not self.can_fork:
            raise RuntimeError("this model's memory cannot fork a slot (recurrent/hybrid or no full SWA cache)")
        src, dst, n = fork.src_slot, fork.dst_slot, fork.n_tokens
        held = C.llama_memory_seq_pos_max(self.mem, src) + 1
        if src == dst or n <= 0 or n > held:
            raise RuntimeError(f"bad fork {fork}: the source slot holds {held} tokens")
        if self.kv_unified:
            C.llama_memory_seq_rm(self.mem, dst, -1, -1)
            C.llama_memory_seq_cp(self.mem, src, dst, 0, n)
            return
        C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)  # never a range between streams: see plan.Fork
        if not C.llama_memory_seq_rm(self.mem, dst, n, -1):
            C.llama_memory_seq_rm(self.mem, dst, -1, -1)
            raise RuntimeError(f"could not trim the copy of slot {src} in slot {dst} to {n} tokens")

    # -- one tick ----------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepResult:
        for fork in plan.forks:
            self.fork(fork)
        if self.deterministic:
            return self._execute_invariant(plan)  # forks applied above: the first llama_decode copies
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
                want[i - 1] = 1
                rows.append((chunk, i - 1))
        batch.n_tokens = i
        if i == 0:  # forks only: llama.cpp performs the queued copies at the next decode
            return StepResult()
        t0 = time.perf_counter()
        status = C.llama_decode(self.ctx, batch)
        C.llama_synchronize(self.ctx)
        t1 = time.perf_counter()
        result = StepResult(status=status, eval_ms=(t1 - t0) * 1000)
        if status != 0:
            return result
        for chunk, row in rows:
            if chunk.sample_apart and self.can_sample_apart:
                result.apart[chunk.slot] = RowJob(self, chunk, row)  # copies the row: the next decode overwrites it
            else:
                self._sample_chunk(chunk, row, result)
        result.sample_ms = (time.perf_counter() - t1) * 1000
        return result

    def _sample_chunk(self, chunk: Any, row: int, result: StepResult) -> None:
        # the chunk's own sampler, then those of an n-request's other samples, which take
        # their first token from the same row (llama_sampler_sample leaves the logits as
        # they are), each with its own chain and seed
        for slot, sampler in ((chunk.slot, chunk.sampler), *chunk.siblings):
            tok = self._sample(sampler, row, chunk.suppress_eog)
            result.sampled[slot] = tok
            if chunk.logprobs is not None:
                result.logprobs[slot] = self._logprobs(row, tok, chunk.logprobs)

    def _sample(self, sampler: _Sampler, row: int, suppress_eog: bool) -> int:
        if suppress_eog and sampler.no_eog_chain:
            # min_tokens not reached: the twin that cannot pick EOG samples every token of
            # this phase (so its own history is whole), and the main chain is told each
            # token so its penalties and mirostat state stay in step for later.
            tok = C.llama_sampler_sample(sampler.no_eog_chain, self.ctx, row)
            C.llama_sampler_accept(sampler.chain, tok)
            return tok
        return C.llama_sampler_sample(sampler.chain, self.ctx, row)

    def _execute_invariant(self, plan: StepPlan) -> StepResult:
        """Deterministic mode: the plan as llama_decode calls shaped by batch_invariance (the
        prefill chunks, one call per padded length, then the decode rows), padding cells
        removed after each."""
        result = StepResult()
        decodes = [c for c in plan.chunks if c.is_decode]

        def passes() -> Iterator[invariance.Pass]:
            yield from invariance.prefill_passes([c for c in plan.chunks if not c.is_decode], self.shapes)
            if decodes:  # shaped only now: its padding rows go after what the prefill passes added
                yield invariance.decode_pass(decodes, self.n_seq_ids, self._next_pos, self.shapes)

        done: list[Any] = []  # chunks already evaluated: rolled back if a later pass fails
        for shaped in passes():
            status = self._run_pass(shaped, result)
            if status != 0:
                for chunk in done:  # llama.cpp rolls back a failed call, not an earlier one
                    C.llama_memory_seq_rm(self.mem, chunk.slot, chunk.start_pos, -1)
                result.status = status
                result.sampled.clear()
                result.logprobs.clear()
                return result
            done += shaped.chunks
        return result

    def _next_pos(self, seq: int) -> int:
        return C.llama_memory_seq_pos_max(self.mem, seq) + 1

    def _run_pass(self, shaped: invariance.Pass, result: StepResult) -> int:
        batch = self.batch
        for i, r in enumerate(shaped.rows):
            batch.token[i] = r.token
            batch.pos[i] = r.pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = r.seq
            batch.logits[i] = 1 if r.logits else 0
        batch.n_tokens = len(shaped.rows)
        t0 = time.perf_counter()
        status = C.llama_decode(self.ctx, batch)
        C.llama_synchronize(self.ctx)
        t1 = time.perf_counter()
        if status == 0:
            for chunk, row in shaped.sample_rows:
                self._sample_chunk(chunk, row, result)
        for seq, pos in shaped.trims:  # the padding rows' cells (none are left after a failure)
            C.llama_memory_seq_rm(self.mem, seq, pos, -1)
        result.eval_ms += (t1 - t0) * 1000
        result.sample_ms += (time.perf_counter() - t1) * 1000
        return status

    def _logprobs(self, row: int, chosen: int, top_n: int) -> dict[str, Any]:
        """The chosen token's log probability and the `top_n` likeliest tokens', from the row's
        raw logits (the model's distribution, before temperature, penalties or grammar: what
        OpenAI and vLLM report). Whole-vocabulary passes run in numpy, over a view of
        llama.cpp's logits buffer (no copy); Python touches only the k tokens it reports."""
        import numpy as np  # only requests that asked for logprobs get here

        logits = np.ctypeslib.as_array(C.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        if self._lp_scratch is None:
            self._lp_scratch = np.empty(self.n_vocab, dtype=np.float32)
        return self.logprobs_from(logits, chosen, top_n, self._lp_scratch, self._piece_buf)

    def logprobs_from(self, logits: Any, chosen: int, top_n: int, scratch: Any, piece_buf: Any) -> dict[str, Any]:
        """`_logprobs` over a logits array (numpy, n_vocab floats), with the caller's own
        scratch array and piece buffer: a sampling thread (row_job.py) calls it too."""
        import numpy as np

        mx = float(logits.max())
        np.subtract(logits, mx, out=scratch)
        np.exp(scratch, out=scratch)
        logz = mx + math.log(float(scratch.sum(dtype=np.float64)))
        out = self._logprob_entry(chosen, float(logits[chosen]) - logz, piece_buf)
        top: list[dict[str, Any]] = []
        if top_n:
            ids = np.argpartition(logits, self.n_vocab - top_n)[self.n_vocab - top_n:]
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            top = [self._logprob_entry(int(t), float(logits[t]) - logz, piece_buf) for t in ids]
        out["top_logprobs"] = top
        return out

    def _logprob_entry(self, token: int, logprob: float, piece_buf: Any) -> dict[str, Any]:
        # The token as text and its bytes (a token can hold part of a UTF-8 character: its text
        # then shows U+FFFD and `bytes` has the truth). Control tokens show their name.
        info = self._lp_tokens.get(token)
        if info is None:
            data = self._piece(token, special=True, buf=piece_buf)
            info = self._lp_tokens[token] = (data.decode("utf-8", "replace"), list(data))
        return {"token": info[0], "id": token, "logprob": logprob, "bytes": list(info[1])}

    def close(self) -> None:
        """Free everything exactly once, whatever happens after."""
        if self._closed:
            return
        self._closed = True
        C.llama_batch_free(self.batch)
        C.llama_free(self.ctx)
        C.llama_model_free(self.model)


_default_model_params = C.llama_model_default_params


# -- CPU weight layouts (see cpu_buffers.py) ----------------------------------------------------

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
    from .repack_rule import repacked_names

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
    from .repack_rule import is_repacked

    repack_used = buffers.get(cpu_buffers.REPACK, 0.0) > 0
    features = cpu_features()
    types = [(t.ggml_type, repack_used and is_repacked(t, features))
             for t in read_tensor_infos(model_path) if len(t.dims) == 2]
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    return invariance.derive_shapes(types, x86)


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


# The bias a -inf logit_bias becomes under a grammar: far below any real logit (they span tens),
# finite, and small enough that dividing by a tiny temperature stays finite in float32 for long.
GRAMMAR_BAN = -1e4

_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Catch what C code prints on fd 2 during the block (llama.cpp's grammar parser uses fprintf,
    not the log callback). Output other threads print meanwhile is passed on afterwards."""
    said: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to catch
            yield said
            return
        os.dup2(tmp.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            if text:
                said.append(text)
                log.debug("llama.cpp printed: %s", text.rstrip())
                ours = text
                if _GRAMMAR_COMPLAINT in text:  # from its line on: the complaint and the grammar echoed
                    before = text[:text.index(_GRAMMAR_COMPLAINT)]
                    ours = before[:before.rfind("\n") + 1]
                if ours.strip():
                    os.write(2, ours.encode())


_GRAMMAR_COMPLAINT = "error parsing grammar: "


def _grammar_complaint(said: list[str]) -> str:
    """'expecting name at ...' from llama.cpp's "parse: error parsing grammar: ...\n\n<grammar>"."""
    for text in said:
        if _GRAMMAR_COMPLAINT in text:
            return text.split(_GRAMMAR_COMPLAINT, 1)[1].split("\n", 1)[0].strip()
    return ""


def _log_mark() -> int:
    """The number of the last llama.cpp log line so far; `_first_error` looks only past it."""
    return _recent_log[-1][0] if _recent_log else 0


def _first_error(mark: int) -> str:
    """The first line llama.cpp logged after `mark` that names a problem: later lines only
    repeat it ("failed to load model"), the first one says why."""
    lines = [text for number, text in _recent_log if number > mark]
    for line in lines:
        low = line.lower()
        if "error" in low or "failed" in low or "invalid" in low or "unknown" in low or "only supports" in low:
            return line.split(": ", 1)[-1].strip()  # drop llama.cpp's "function_name: " prefix
    return lines[-1].strip() if lines else "no details from llama.cpp"


# --- llama.cpp's built-in chat formats ----------------------------------------------------


class LlamaChatFormats:
    """llama.cpp's built-in chat formats (llama_chat_builtin_templates / llama_chat_apply_template).

    They need no model: a format is picked by name, or detected by llama.cpp from a
    Jinja template's text. chat_template.py chooses which; this class only calls llama.cpp.
    """

    def names(self) -> tuple[str, ...]:
        return _builtin_template_names()

    def apply(self, template: str, messages: list[dict], add_generation_prompt: bool) -> str | None:
        """The prompt llama.cpp renders for `messages` with `template` (a built-in name, or
        Jinja text it recognises by its markers); None when llama.cpp does not know it."""
        encoded = [(str(m["role"]).encode("utf-8"), str(m["content"]).encode("utf-8")) for m in messages]
        chat = (C.llama_chat_message * max(1, len(encoded)))(
            *[C.llama_chat_message(role, content) for role, content in encoded])
        size = 2 * sum(len(r) + len(c) for r, c in encoded) + 1024
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = C.llama_chat_apply_template(template.encode("utf-8"), chat, len(encoded), add_generation_prompt,
                                            buf, size)
            if n < 0:
                return None
            if n < size:  # llama.cpp copies with strncpy: only a shorter result is whole
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        return None


@functools.lru_cache(maxsize=1)
def _builtin_template_names() -> tuple[str, ...]:
    count = C.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * count)()
    C.llama_chat_builtin_templates(out, count)
    return tuple(name.decode("utf-8") for name in out[:count])
