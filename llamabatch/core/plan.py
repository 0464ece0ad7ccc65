"""The data that crosses between scheduler and runner each tick, and the Runner protocol.

The scheduler produces a StepPlan; the runner applies its KV trims and forks, turns its
chunks into one llama_decode and samples the rows that asked for logits; the scheduler
consumes the StepResult. The plan is the whole contract for a tick, as vLLM's
SchedulerOutput is: every change to a slot's KV cache rides on it (Trim, Fork, Chunk), and
each chunk that wants logits carries the sampler chain to sample its row with and how many
logprobs to report, so `runner.execute(plan)` needs nothing else (no per-slot sampler state
on the side, no KV call around the plan, no reaching back into the scheduler's sequences).
The Runner protocol below is the rest: the model's facts and the sampler chains' lifetime.
Plain dataclasses keep the scheduler testable with a scripted fake runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass
class Chunk:
    """Tokens of one slot evaluated in this tick, at positions start_pos, start_pos+1, ..."""

    slot: int
    request_id: int
    tokens: list[int]
    start_pos: int
    wants_logits: bool  # True when the chunk reaches the end of what is known: sample after it
    is_decode: bool  # one generated token being fed back (as opposed to a prompt chunk)
    suppress_eog: bool = False  # min_tokens not reached: an end-of-generation token must be resampled
    sampler: Any = None  # the request's sampler chain (runner.build_sampler); samples the row when wants_logits
    logprobs: int | None = None  # report the sampled token's logprob and this many alternatives (None = no)
    # The other samples of an n-request, (slot, sampler): after this chunk (the end of the prompt)
    # each samples its first token from the same logits row with its own chain (seed + i), so
    # n samples cost one prefill.
    siblings: list[tuple[int, Any]] = field(default_factory=list)
    # Sample this row apart from the tick (sampling.py): the runner copies the row's logits and
    # returns a job in StepResult.apart instead of a token, so one request's costly sampler (a
    # grammar over a large vocabulary) does not hold up every other slot's next token.
    sample_apart: bool = False
    # Speculative decoding (core/drafts.py): the last n_draft tokens are guesses of what the
    # request samples next, evaluated as rows of this same decode. The runner asks logits for
    # the last n_draft + 1 rows and samples them in order with the chunk's sampler, keeping
    # each guess its sampling agrees with (the row's own token is the guess: runner.py
    # chunk_sampling.ChunkSampler.verify); at the first disagreement the token it sampled there
    # ends the chunk's output (else the last row's sample does). StepResult.accepted says how
    # many guesses were kept; the KV cells of the others go in the next plan's Trim.
    n_draft: int = 0


@dataclass(frozen=True)
class Trim:
    """Make `slot`'s KV cache hold only its first `n_keep` tokens (positions >= n_keep go).

    Semantics, as the runner applies it:
    - trims run in list order at the start of `runner.execute(plan)`, before the plan's
      forks and its llama_decode; like forks they take effect even when that decode then
      fails, so a retry plan (Scheduler.shrink) does not carry them again;
    - `0 <= n_keep <= len(what the slot holds)`; `n_keep == 0` empties the slot and every
      runner can do it; `n_keep > 0` keeps part of a sequence, which only a runner whose
      `capabilities.can_trim` is True can (recurrent/hybrid memories cannot; a sliding-window cache
      only keeps the early cells at full size): the scheduler plans none elsewhere, and a
      runner refuses one it cannot keep exactly (RuntimeError) rather than let a chunk be
      evaluated after a prefix that is gone;
    - the slot's chunk in the same plan (if any) starts at `n_keep`, unless a fork in the
      plan fills the slot afterwards (trims run first, so the fork wins).

    The scheduler decides trims and updates its own bookkeeping of the slot at once:
    admission keeps the part of a slot's own cache that the new prompt reuses, and a failed
    llama_decode empties its slots (decided after that tick's plan ran, so the next plan
    carries it; nothing reads the stale cells meanwhile: the slot is idle, and a fork
    source is always a busy slot).
    """

    slot: int
    n_keep: int


@dataclass(frozen=True)
class Fork:
    """Make `dst_slot`'s KV cache hold exactly `src_slot`'s first `n_tokens` tokens.

    The KV fork primitive, shared by prefix sharing across slots (a request whose prompt
    starts like one another slot has evaluated copies that part instead of evaluating it
    again) and by `n` samples of one prompt (every sample after the first starts from a
    copy of the first one's prefill).

    Semantics, as the runner applies it (llama.cpp, one KV stream per slot):
    - forks run in list order in `runner.execute(plan)`, after the plan's trims and before
      the tick's llama_decode, and they take effect even when that decode then fails (llama.cpp
      performs pending stream copies first): a retry plan must not carry them again;
    - the source is read as it is *before* this tick's chunks are evaluated, so a slot may
      be a fork source and evaluate its own chunk in the same tick;
    - whatever `dst_slot` held before is gone; afterwards it holds positions 0..n_tokens-1
      of the source, and its chunk in the same plan (if any) must start at `n_tokens`;
    - `0 < n_tokens <= len(what src holds)`, `src_slot != dst_slot`, and a slot is the
      destination of at most one fork per plan and not also a source in it.

    How, with one KV stream per slot (the default): `llama_memory_seq_cp(src, dst, -1, -1)`
    copies the whole stream (a partial copy between streams aborts the process in llama.cpp:
    "seq_cp() is only supported for full KV buffers"), then `llama_memory_seq_rm(dst,
    n_tokens, -1)` trims the copy. The buffer copy itself happens inside the next
    llama_decode and costs the whole slot's KV (all of slot_ctx, not only n_tokens). With a
    unified cache (`kv_unified`) `seq_cp(src, dst, 0, n_tokens)` makes the cells shared: no
    data moves. It is exact only when the whole prefix is still in
    the cache: with Gemma 3's sliding window that needs the full-size SWA cache, which the
    runner keeps whenever `cache_prompt` is on. Recurrent/hybrid models cannot trim a copy:
    `runner.capabilities.can_fork` is False for them and the scheduler never plans a fork.

    The scheduler decides forks (`Scheduler.fork`, or admission when prompts share a
    prefix) and updates its own bookkeeping of `dst`'s cache at once; the runner only copies.
    """

    src_slot: int
    dst_slot: int
    n_tokens: int


@dataclass(frozen=True)
class Move:
    """Make `dst_slot`'s KV cache hold exactly what `src_slot` holds (`n_tokens` positions), for
    the request on `src_slot` to go on in `dst_slot`: with a KV stream per slot llama.cpp runs a
    tick in one graph run only across consecutive slots, so an idle slot between busy ones
    splits every tick until something fills it (kv_ledger.KVLedger.plan_moves).

    Semantics, as the runner applies it: after the plan's forks and before its llama_decode
    (taking effect even when that decode fails, as forks do); `src_slot` keeps its cells, as an
    idle slot's cache; whatever `dst_slot` held is gone. Never planned with one KV cache the
    slots share. How: `llama_memory_seq_cp(src, dst, -1, -1)` copies the whole stream (cell
    metadata at once, the buffers at the start of the next llama_decode: every plan carrying a
    Move carries the moved request's chunk). A copy that does not leave `dst_slot` holding
    `n_tokens` positions empties it (`StepResult.emptied`): the request evaluates its tokens
    again there, and no token is lost or repeated.
    """

    src_slot: int
    dst_slot: int
    n_tokens: int


@dataclass(frozen=True)
class Restore:
    """Make `slot`'s KV cache hold exactly the `n_tokens` tokens whose KV `payload` carries (a
    disk prefix store entry: core/prefixes/disk_prefix.py, written by `runner.snapshot`).

    Semantics, as the runner applies it: after the plan's trims and before its forks; whatever
    the slot held is gone. It may fail (llama.cpp finds no room for the cells, or refuses the
    bytes): `StepResult.restored[slot]` says which, and a failed slot is empty. So the plan
    carries no chunk for that slot: the scheduler plans its first chunk in the next tick, from
    what the restore really gave (0 tokens after a failure). An entry is only ever continued
    from its end: with Gemma 3's sliding window llama.cpp saves only the last 512 positions of
    the window layers, so a restored slot cannot be trimmed shorter (the store only offers
    entries whose whole token list starts the prompt). A slot restored with fewer tokens than
    the runner's `capabilities.restored_whole_below` holds every position of every layer, so later requests
    may keep any prefix of it, as of a slot that evaluated them.
    """

    slot: int
    n_tokens: int
    payload: Any = field(repr=False, compare=False)
    # A preempted request's own KV put back (core/scheduling/admission.py's parking), not a store entry:
    # it continues from its end as the store's entries do; a runner may do it where `capabilities.can_park`.
    resume: bool = False


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    forks: list[Fork] = field(default_factory=list)  # applied before the chunks are evaluated
    trims: list[Trim] = field(default_factory=list)  # applied first: before the forks and the chunks
    restores: list[Restore] = field(default_factory=list)  # after the trims, before the forks
    moves: list[Move] = field(default_factory=list)  # after the forks, before the chunks

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def decode_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if c.is_decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks if not c.is_decode)

    @property
    def draft_tokens(self) -> int:
        return sum(c.n_draft for c in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks or self.forks or self.trims or self.restores or self.moves)

    def without_slots(self, slots: set[int]) -> "StepPlan":
        """This plan less the chunks of `slots` (its KV changes stay, already applied or not)."""
        if not slots:
            return self
        return StepPlan([c for c in self.chunks if c.slot not in slots], self.forks, self.trims, self.restores,
                        self.moves)


@dataclass
class StepResult:
    """What one llama_decode gave. status follows llama_decode: 0 ok, 1 no KV room, 2 stopped by
    Runner.interrupt (INTERRUPTED), <0 fatal."""

    status: int = 0
    sampled: dict[int, int] = field(default_factory=dict)  # slot -> token sampled after its chunk
    logprobs: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> logprob record
    eval_ms: float = 0.0
    sample_ms: float = 0.0
    fill_ms: float = 0.0  # writing the plan into the llama_batch, before llama_decode
    ubatches: int = 0  # graph runs llama_decode made of the batch (kernel_paths/ubatch_split.py)
    # slot -> a SampleJob for each sample_apart chunk: run on a sampling thread, it gives that
    # chunk's tokens (its own and its siblings') later; the slot's request waits for them.
    apart: dict[int, "SampleJob"] = field(default_factory=dict)
    restored: dict[int, bool] = field(default_factory=dict)  # slot -> whether its Restore took
    # slot -> tokens its grammar forced after the sampled one (llama/sampling/mask_grammar.py): they
    # join the output unsampled and are evaluated with the next tick's decode chunk
    forced: dict[int, list[int]] = field(default_factory=dict)
    # slot -> (one-line error, code) for a request whose sampling failed on its own account (its
    # grammar stopped): that request ends with the error, the tick and the others go on
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)
    # slot -> how many of its chunk's n_draft guesses the verification kept (they join the
    # output before the slot's `sampled` token), and their logprob records when asked for
    accepted: dict[int, int] = field(default_factory=dict)
    accepted_logprobs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    interrupted: bool = False  # the engine's record of a tick whose decode was interrupted (nothing kept)
    # Slots a Trim or Fork of the plan could not leave holding what the scheduler planned (the
    # cells it needed had been reused: Runner.keep_floor): emptied instead, and their chunks
    # not evaluated; their requests evaluate their tokens again from the start.
    emptied: set[int] = field(default_factory=set)


INTERRUPTED = 2  # llama_decode's "aborted": the decode was stopped and its cells taken out again


@dataclass
class EmbedBatch:
    """Inputs to embed in one llama_decode of the runner's embedding context: one sequence
    each, pooled with `pooling` (mean, cls or last) into one vector each."""

    pooling: str
    inputs: list[list[int]]

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for t in self.inputs)


@dataclass
class EmbedStepResult:
    """What one embedding llama_decode gave: a pooled, unnormalized vector per input (in
    order) when status is 0; else status follows llama_decode, or -100 with `error` when the
    embedding context could not be made."""

    status: int = 0
    vectors: list[list[float]] = field(default_factory=list)
    eval_ms: float = 0.0
    error: str = ""
    code: str = ""  # the error's code when it is not a decode error (resource_limit)


class SampleJob(Protocol):
    """One logits row (copied: the next llama_decode overwrites the context's) and the sampler
    chains to sample it with. `run` may be called on any thread, once; it checks `stop()`
    between slices of work and raises SampleStopped when it says True (a cancel or timeout
    should not wait for a slow grammar to finish a whole pass over the vocabulary)."""

    samplers: list[Any]  # every chain the job uses: none may be freed until run returns

    def run(self, stop: Callable[[], bool]) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
        """(slot -> token, slot -> logprob record) for the chunk's slot and its siblings."""


class SampleStopped(Exception):
    """A SampleJob gave up because `stop()` said so."""


class ChatFormats(Protocol):
    """llama.cpp's built-in chat formats, as a runner offers them (they need no model); a chat
    template (models/chat_template.py) renders a named format through them."""

    def names(self) -> tuple[str, ...]: ...

    def apply(self, template: str, messages: list[dict], add_generation_prompt: bool) -> str | None: ...


@dataclass(frozen=True)
class RunnerCapabilities:
    """What plans may ask of a runner and the KV facts admission needs, declared once by the
    runner (Runner.capabilities): the defaults ask nothing a plain runner might not do."""

    can_fork: bool = False  # whether plans may carry Forks and Moves (False for recurrent/hybrid models)
    can_trim: bool = False  # whether a Trim may keep part of a slot (n_keep > 0); emptying one always works
    can_sample_apart: bool = False  # whether sample_apart chunks come back as SampleJobs (else sampled inline)
    can_store: bool = False  # whether slots may be saved to / restored from the disk prefix store
    # whether a running request's slot may be snapshotted and put back into another slot later
    # (Restore.resume): preemption keeps the request's KV in host memory this way
    can_park: bool = False
    # A slot restored (Restore) with fewer tokens than this holds all of them in every layer (a
    # sliding window's cells go only once the sequence outgrows what its mask keeps), so a Trim
    # may keep any prefix of it; None: it is continued from its end only.
    restored_whole_below: int | None = None
    can_verify: bool = False  # whether decode chunks may carry draft tokens (Chunk.n_draft) to verify
    # The most guesses one decode chunk carries (None: speculation's own limit), and how many of
    # them take rows at no cost (deterministic mode's padding rows)
    max_draft: int | None = None
    free_draft: int = 0
    # The most rows one slot's decode chunk may take, its pending tokens and guesses together
    # (deterministic mode pads each pass to a fixed shape); None: any number
    max_decode_rows: int | None = None
    # A KV pool the slots share (a unified cache), in cells; requests are admitted by room in it
    # (core/scheduling/kv_ledger.py). None: a stream of slot_ctx cells per slot.
    pool_cells: int | None = None
    kv_mib: float | None = None  # the KV cache's size in MiB, by llama.cpp's count (None: not known)

    @property
    def draft_limits(self) -> dict[str, int]:
        """Speculation's max_draft and free, where this runner sets them."""
        return {} if self.max_draft is None else {"max_draft": self.max_draft, "free": self.free_draft,
                                                  "max_rows": self.max_decode_rows}


class Runner(Protocol):
    """Everything that touches llama.cpp: the runner contract with `StepPlan`. The real one is
    `llama.runner.LlamaRunner`; tests/fake_runner.py implements all of it with a script."""

    # -- the model's facts ----------------------------------------------------------------
    model_path: str  # the GGUF file
    n_slots: int  # sequences the context holds side by side (n_parallel)
    slot_ctx: int  # tokens one slot holds (in a shared pool: the most one request may hold)
    n_vocab: int  # token ids are 0..n_vocab-1
    metadata: dict[str, str]  # the GGUF's key/values (tokenizer.chat_template when it has one)
    bos_text: str  # the text of the BOS / EOS tokens ("" when none), for chat templates
    eos_text: str
    chat_formats: ChatFormats  # llama.cpp's built-in chat formats (they need no model)

    @property
    def kernel_text(self) -> str:
        """Which CPU kernels run, and why, for the header line ("" when none apply)."""

    capabilities: RunnerCapabilities  # what plans may ask of it, declared once

    def keep_floor(self, slot: int) -> int:
        """The shortest prefix of what `slot` holds that a Trim may keep, or a Fork copy, right
        now (0: any). In one KV cache every slot shares, llama.cpp reuses a window layer's cells
        that their own sequence no longer sees for any other sequence, so an idle slot's cached
        prompt may lose its early window cells to its neighbours' work at any tick."""
        ...
    kv_fingerprint: dict[str, str]  # what must match for saved KV bytes to be restored here

    def graph_runs(self, runs: list[tuple[int, int]]) -> int:
        """How many graph runs llama_decode makes of a batch of (slot, rows) runs in this
        order (kernel_paths/ubatch_split.py): what a tick with guesses would cost in passes."""
        ...

    def accept_forced(self, sampler: Any, tokens: list[int]) -> None:
        """Tell a request's sampler (its chain and grammar) of tokens the engine wrote into its
        answer unsampled (a thinking budget's closer, core/thinking.py); InvalidRequest where its
        grammar cannot take them."""
        ...

    def valid_guesses(self, sampler: Any, tokens: list[int]) -> int:
        """How many of `tokens`, in order, the request's grammar allows next (all of them for a
        request without a token-mask grammar): its guesses are cut there."""
        ...

    def tokenize(self, text: str, *, special: bool, add_special: bool = True) -> list[int]:
        """`add_special`: with the BOS/EOS the model adds to a prompt (False: /tokenize's default)."""
        ...

    def longest_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of text one token can stand for (None: no such bound), so
        a prompt too long for a slot is refused before tokenizing it."""
        ...

    def token_bytes(self, token: int) -> bytes: ...

    def token_piece(self, token: int) -> bytes:
        """A token's text as llama.cpp renders it with special tokens shown (`<|im_end|>`),
        as llama-server's /tokenize and /detokenize give it; safe off the engine thread."""
        ...

    def is_eog(self, token: int) -> bool: ...

    def build_sampler(self, params: Any, seed: int) -> Any:
        """Build a sampler chain (raises InvalidRequest for e.g. a grammar that does not parse)."""

    def free_sampler(self, sampler: Any) -> None: ...

    def snapshot(self, slot: int) -> bytes | bytearray:
        """The slot's KV as bytes, for the disk prefix store (a Restore puts them back)."""

    def interruptible(self, plan: StepPlan) -> bool:
        """Whether `interrupt()` can stop `execute(plan)` part-way with nothing of its decode kept
        (one graph run; not in deterministic mode, whose passes are several decodes)."""
        ...

    def interrupt(self) -> None:
        """From any thread: the interruptible execute() in flight stops at its next graph node and
        returns status INTERRUPTED, its trims, restores and forks applied, its decode undone and
        nothing sampled. Set until clear_interrupt(); call it only while such a plan runs."""

    def clear_interrupt(self) -> None: ...

    def execute(self, plan: StepPlan) -> StepResult:
        """Apply plan.trims, then plan.restores, then plan.forks, then plan.moves, then one llama_decode of the plan's chunks;
        sample each wants_logits row with its chunk's sampler, or, for a sample_apart chunk
        on a runner whose `capabilities.can_sample_apart` is True, return a SampleJob for it in
        StepResult.apart."""

    # -- embeddings (a context of their own: llama/embedder.py) ---------------------------
    n_embd: int  # the length of a pooled vector
    embed_max_tokens: int  # the most tokens of one EmbedBatch (and so of one input)
    embed_max_seqs: int  # the most inputs of one EmbedBatch (1 in deterministic mode)
    default_pooling: str  # the GGUF's own pooling type when it has one, else "mean"
    embed_refusal: str  # why this model gives no embeddings ("" when it does)

    def embed(self, batch: EmbedBatch) -> EmbedStepResult:
        """One llama_decode of `batch` in the embedding context, one pooled vector per input."""

    def close(self) -> None: ...
