"""A scripted stand-in for LlamaRunner: the engine's tick loop tested without a model.

Vocabulary: one token per character, token id = the character's code point. Two control
tokens (EOG, FILL) and 256 raw-byte tokens (BYTE_BASE + b) for UTF-8 split tests.

The fake keeps its own copy of every slot's "KV cache" (the tokens at positions 0..n-1)
and checks each plan against it (its trims, then its forks, then its chunks, in the order
the real runner applies them), so tests can assert that the engine never evaluates a
token at the wrong position, never overfills a slot, never exceeds n_batch, never trims
to more than a slot holds, and never evaluates or copies a slot whose cache a failed
decode left unknown before a trim empties it. Every executed plan is recorded
(deep-copied) with the status it got.

Replies are scripted per prompt: `reply(prompt_text) -> str | list[int]` gives the tokens
a request samples, one per wanted row; after the reply comes EOG (or FILL tokens when the
request ignores EOG; FILL also replaces EOG while min_tokens suppresses it).
"""
from __future__ import annotations

import array
import bisect
import copy
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from llamabatch.errors import InvalidRequest
from llamabatch.core.plan import (INTERRUPTED, EmbedBatch, EmbedStepResult, Runner, RunnerCapabilities, SampleStopped,
                                  StepPlan, StepResult)
from llamabatch.kernel_paths.ubatch_split import ubatch_sizes

EOG = 1  # end of generation
FILL = ord("~")  # sampled where EOG is blocked (ignore_eos, min_tokens)
BYTE_BASE = 0x110000  # tokens BYTE_BASE..BYTE_BASE+255 are single raw bytes
N_VOCAB = BYTE_BASE + 256


def text_tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def byte_tokens(data: bytes) -> list[int]:
    """Tokens that spell `data` one raw byte each (a multi-byte character split across tokens)."""
    return [BYTE_BASE + b for b in data]


def token_piece(tok: int) -> bytes:
    if tok >= BYTE_BASE:
        return bytes([tok - BYTE_BASE])
    if tok == EOG:
        return b""
    return chr(tok).encode("utf-8")


def detokenize(tokens: list[int]) -> str:
    return b"".join(token_piece(t) for t in tokens).decode("utf-8", "replace")


def fake_logprobs(tok: int, top_n: int) -> dict[str, Any]:
    """A logprob record shaped like the real runner's: the chosen token at -0.5, and top_n
    alternatives (the chosen one first, then the next code points) at -0.5, -1.5, ..."""
    def entry(t: int, lp: float) -> dict[str, Any]:
        return {"token": detokenize([t]), "id": t, "logprob": lp, "bytes": list(token_piece(t))}

    alts = [tok] + [t for t in range(ord("a"), ord("a") + top_n + 1) if t != tok]
    return {**entry(tok, -0.5), "top_logprobs": [entry(t, -0.5 - i) for i, t in enumerate(alts[:top_n])]}


FAKE_N_EMBD = 8


def fake_token_vector(tok: int) -> list[float]:
    """The fake model's vector of one token: fixed, different for every token id."""
    return [math.sin(tok * (j + 1) * 0.001) + 0.01 * (j + 1) for j in range(FAKE_N_EMBD)]


def fake_embedding(tokens: list[int], pooling: str) -> list[float]:
    """The fake runner's pooled (unnormalized) vector: the mean, first or last token vector."""
    if pooling == "cls":
        return fake_token_vector(tokens[0])
    if pooling == "last":
        return fake_token_vector(tokens[-1])
    rows = [fake_token_vector(t) for t in tokens]
    return [sum(col) / len(rows) for col in zip(*rows)]


def missing_runner_members(runner: Any) -> list[str]:
    """The members of the Runner protocol (core/plan.py) that `runner` lacks: its annotated
    attributes, properties and methods (a method must be callable)."""
    missing = [name for name in Runner.__annotations__ if not hasattr(runner, name)]
    for name, member in vars(Runner).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property) and not hasattr(runner, name):
            missing.append(name)
        elif callable(member) and not callable(getattr(runner, name, None)):
            missing.append(name)
    return missing


FAKE_KV_MAGIC = b"FAKEKV1\n"  # the fake runner's snapshot bytes: this, then the slot's tokens (int32)


@dataclass(eq=False)
class FakeSampler:
    params: Any
    seed: int
    reply: list[int] | None = None  # fixed on the first sample, from the slot's prompt
    emitted: int = 0
    freed: int = 0
    prompt_text: str | None = None
    matcher: Any = None  # grammar "STOPS": a mask-grammar request (sampled inline, as masked ones are)
    rng: Any = None  # numpy generator for the `probs` mode, seeded from `seed` on first use

    @property
    def grammar_backend(self) -> str | None:
        if self.matcher is not None:
            return "llguidance"
        return "llama" if self.params.grammar or self.params.json_schema is not None else None


def _as_it_was(plan: StepPlan) -> StepPlan:
    """A copy of the plan that later changes to it do not reach: its chunks and their token and
    sibling lists are copied; the samplers, and the trims, forks and restores (frozen), are shared."""
    chunks = [replace(c, tokens=list(c.tokens), siblings=list(c.siblings)) for c in plan.chunks]
    return StepPlan(chunks, list(plan.forks), list(plan.trims), list(plan.restores), list(plan.moves))


@dataclass
class ExecutedPlan:
    call: int  # 1-based execute() call number
    plan: StepPlan
    status: int
    sampled: dict[int, int] = field(default_factory=dict)
    apart: list[int] = field(default_factory=list)  # slots whose row went out as a FakeJob


class FakeRunner:
    """Implements the Runner protocol in llamabatch/core/plan.py with scripted behaviour.

    reply:        prompt text -> reply (str or token list); default echoes "<prompt>!".
    status:       {call_no: status} or a callable (call_no, plan) -> status; 0 when absent.
    partial_trim: False makes `can_trim` False, like a recurrent model that cannot keep part
                  of a sequence: a planned Trim with n_keep > 0 is then a violation.
    hook:         called as hook(call_no, plan) at the start of every execute(), on the
                  engine thread; tests use it to block a tick or to submit mid-tick.
    step_delay:   seconds each execute() sleeps (for cancel/timeout tests).
    can_fork:     whether plans may carry Forks; every fork is applied to the fake KV (copy the
                  source's first n tokens, as the real runner does before its decode) and checked.
    sample_delay: prompt text -> seconds sampling one row of that request takes (a slow
                  grammar), inline or in a FakeJob; None: no delay.
    can_sample_apart: whether chunks marked sample_apart become FakeJobs (like LlamaRunner
                  outside deterministic mode); False samples them inline.
    can_interrupt: whether interrupt() stops an execute() part-way (like LlamaRunner's decode):
                  the step_delay ends early, the trims, restores and forks stay applied and the
                  decode returns INTERRUPTED with nothing kept or sampled.
    eval_ms:      what each decode says it took (the engine leaves a decode it thinks more than
                  half done to finish: tests of interrupts give a realistic 40).
    """

    def __init__(self, n_slots: int = 4, slot_ctx: int = 64, *, n_batch: int | None = None,
                 reply: Callable[[str], str | list[int]] | None = None,
                 status: dict[int, int] | Callable[[int, StepPlan], int] | None = None,
                 partial_trim: bool = True, hook: Callable[[int, StepPlan], None] | None = None,
                 step_delay: float = 0.0, metadata: dict[str, str] | None = None, can_fork: bool = True,
                 sample_delay: Callable[[str], float] | None = None, can_sample_apart: bool = True,
                 embed_status: dict[int, int] | None = None, embed_delay: float = 0.0,
                 embed_max_tokens: int = 64, embed_max_seqs: int = 8, default_pooling: str = "mean",
                 embed_refusal: str = "", can_store: bool = True, can_park: bool = True, restore_ok: Callable[[int], bool] | None = None,
                 force: Callable[[str], int] | None = None, can_verify: bool = False,
                 probs: Callable[[list[int]], dict[int, float]] | None = None,
                 grammar_allows: Callable[[int], bool] | None = None, pool_cells: int | None = None,
                 can_interrupt: bool = True, eval_ms: float = 0.5, restored_whole_below: int | None = None,
                 window: int = 0, move_ok: Callable[[int], bool] | None = None):
        self.can_interrupt = can_interrupt
        self.eval_ms = eval_ms  # what each decode reports it took (the engine estimates tick times from it)
        self._stop = threading.Event()  # interrupt() sets it; clear_interrupt() clears it
        self.interrupted_calls: list[int] = []  # execute() calls that interrupt() stopped
        # A request with a grammar allows only the tokens grammar_allows says yes to (the
        # scripted reply is assumed to keep to it): valid_guesses cuts guesses at the first other.
        self.grammar_allows = grammar_allows
        # Speculative decoding: whether decode chunks may carry guesses (Chunk.n_draft). Each of a
        # verified chunk's rows is sampled in order as a row of its own would be, a guess kept
        # while it equals that row's token; with `probs` (the tokens before a row -> {token: p}, a
        # known distribution of what precedes the row) each row is one draw from it with the
        # sampler's own generator, guess or not, as the real runner samples (llama/sampling/chunk_sampling.py ChunkSampler.verify).
        self.probs = probs
        self._last_dist: tuple[tuple, list[int], list[float]] | None = None  # _draw's: (distribution, ids, cumulative)
        # A grammar's forced tokens (llama/sampling/mask_grammar.py): after each inline sample, force(the
        # reply's text so far) says how many of the reply's next tokens come forced, unsampled.
        self.force = force
        # The disk prefix store: snapshot() gives the slot's fake KV as bytes, a Restore puts
        # them back; restore_ok(slot) False scripts llama.cpp refusing one (the slot is emptied).
        self.restore_ok = restore_ok or (lambda slot: True)
        self.kv_fingerprint = {"model": "fake", "layout": "fake"}
        self.restores: list[tuple[int, int, bool]] = []  # (slot, n_tokens, took) applied, in order
        # slot -> its restored length: like Gemma 3's window layers in llama.cpp, a restored slot
        # (or a fork of one) can be cut back only from there on; shorter is a violation
        self.floor: dict[int, int] = {}
        # Like Gemma 3's window layers in one KV cache the slots share: lose_window(slot, n) says a
        # neighbour's work took the slot's positions below n, so continuing it needs a prefix of at
        # least n + window tokens (keep_floor); a Trim or Fork shorter empties the slot (emptied).
        self.window = window
        self.lost_below: dict[int, int] = {}
        self.snapshots: list[tuple[int, int]] = []  # (slot, tokens) snapshotted, in order
        # can_park: preemption, a running slot snapshotted and put back later (Restore.resume);
        # kv_mib None: the KV cache's size is not known, so parked KV may take 1 GiB
        # pool_cells: a KV pool the slots share (a unified cache): the slots together never hold more than
        # pool_cells tokens (a plan that would is a violation), one slot up to slot_ctx of them.
        # restored_whole_below: a restore of fewer tokens brings every position back (a sequence
        # inside the sliding window), so the slot may be cut back anywhere. None: like Gemma 3's
        # window layers past their window, only from its restored end (self.floor)
        self.capabilities = RunnerCapabilities(
            can_fork=can_fork, can_trim=partial_trim, can_sample_apart=can_sample_apart, can_store=can_store,
            can_park=can_park, restored_whole_below=restored_whole_below, can_verify=can_verify,
            pool_cells=pool_cells, kv_mib=None)
        self.kernel_text = ""  # no llama.cpp kernels: the header line names none
        self.bos_text = self.eos_text = ""  # the fake vocabulary has no BOS/EOS text
        self.sample_delay = sample_delay
        self.jobs: list[FakeJob] = []  # every FakeJob handed out, in order
        self.flying: dict[int, FakeJob] = {}  # request id -> its job while run() has not returned
        self.n_slots = n_slots
        self.slot_ctx = slot_ctx
        self.n_batch = n_batch
        self.n_vocab = N_VOCAB
        self.tokenized_chars = 0  # what tokenize() was given, all calls together
        self.metadata = metadata if metadata is not None else {"general.architecture": "fake"}
        self.model_path = "/models/fake-model.gguf"
        self.reply = reply or (lambda prompt: prompt + "!")
        # a reply taking (prompt, seed) scripts seeded sampling: the n samples of one prompt differ
        self.reply_takes_seed = reply is not None and reply.__code__.co_argcount == 2
        self.status = status or {}
        self.hook = hook
        self.step_delay = step_delay
        self.kv: list[list[int]] = [[] for _ in range(n_slots)]
        self.plans: list[ExecutedPlan] = []
        self.trims: list[tuple[int, int]] = []  # (slot, n_keep) applied, in order
        self.stale: set[int] = set()  # slots a failed decode left unknown, until a trim empties them
        self.samplers: list[FakeSampler] = []
        self.written: list[list[int]] = []  # accept_forced's tokens, in order
        self.violations: list[str] = []
        self.forks: list[tuple[int, int, int]] = []  # (src, dst, n_tokens) applied, in order
        # Moves (plan.Move), as llama.cpp copies a whole stream: the destination becomes the
        # source's copy and the source keeps its cells; move_ok(dst) False scripts a copy that
        # failed (the destination is emptied, as LlamaRunner does).
        self.moves: list[tuple[int, int, int]] = []  # (src, dst, n_tokens) applied, in order
        self.move_ok = move_ok or (lambda slot: True)
        self.close_calls = 0
        self.calls = 0
        self._lock = threading.Lock()
        # embeddings: fixed fake vectors (fake_embedding); embed_status scripts llama_decode's
        # status by embed() call number; every batch is recorded with its status
        self.n_embd = FAKE_N_EMBD
        self.embed_max_tokens = embed_max_tokens
        self.embed_max_seqs = embed_max_seqs
        self.default_pooling = default_pooling
        self.embed_refusal = embed_refusal
        self.embed_status = embed_status or {}
        self.embed_delay = embed_delay
        self.embed_batches: list[tuple[EmbedBatch, int]] = []

    # -- model facts -------------------------------------------------------------------

    @property
    def chat_formats(self) -> Any:
        """llama.cpp's built-in chat formats, as the real runner has them (they need no model);
        imported on first use so that a test that renders no chat does not load llama_cpp."""
        from llamabatch.llama.chat_formats import LlamaChatFormats

        return LlamaChatFormats()

    def tokenize(self, text: str, *, special: bool, add_special: bool = True) -> list[int]:
        self.tokenized_chars += len(text)
        return text_tokens(text)

    def longest_token_bytes(self) -> int | None:
        return 4  # one token per character

    def token_bytes(self, token: int) -> bytes:
        return token_piece(token)

    def token_piece(self, token: int) -> bytes:
        return b"<eog>" if token == EOG else token_piece(token)  # special tokens shown, as llama.cpp's

    def is_eog(self, token: int) -> bool:
        return token == EOG

    # -- samplers ----------------------------------------------------------------------

    def build_sampler(self, params: Any, seed: int) -> FakeSampler:
        if params.grammar == "BAD":
            raise InvalidRequest("grammar does not parse (fake: BAD)")
        sampler = FakeSampler(params, seed, matcher=object() if params.grammar == "STOPS" else None)
        with self._lock:
            self.samplers.append(sampler)
        return sampler

    def free_sampler(self, sampler: FakeSampler | None) -> None:
        if sampler is not None:
            with self._lock:
                if any(sampler in job.samplers for job in self.flying.values()):
                    self.violations.append("a sampler was freed while a sampling thread used it")
            sampler.freed += 1

    # -- one tick ----------------------------------------------------------------------

    def _status_for(self, call: int, plan: StepPlan) -> int:
        if callable(self.status):
            return self.status(call, plan)
        return self.status.get(call, 0)

    def interruptible(self, plan: StepPlan) -> bool:
        return self.can_interrupt and self.graph_runs([(c.slot, len(c.tokens)) for c in plan.chunks]) == 1

    def interrupt(self) -> None:
        self._stop.set()

    def clear_interrupt(self) -> None:
        self._stop.clear()

    def execute(self, plan: StepPlan) -> StepResult:
        self.calls += 1
        call = self.calls
        if self.hook is not None:
            self.hook(call, plan)
        if self.step_delay:
            self._stop.wait(self.step_delay)  # the decode's time, cut short by interrupt()
        emptied = self._apply_trims(plan)  # first, as the real runner: a trimmed slot may be a fork's destination
        restored = self._apply_restores(plan)
        self._apply_forks(plan, emptied)  # before the decode, and kept even when the decode fails
        self._apply_moves(plan, emptied)  # after the forks, as LlamaRunner
        plan = plan.without_slots(emptied)  # as LlamaRunner: an emptied slot's chunk is not evaluated
        self._check(plan)
        status = self._status_for(call, plan)
        if self._stop.is_set() and self.interruptible(plan):
            status = INTERRUPTED
            self.interrupted_calls.append(call)
        record = ExecutedPlan(call, _as_it_was(plan), status)
        self.plans.append(record)
        result = StepResult(status=status, eval_ms=self.eval_ms,
                            ubatches=self.graph_runs([(c.slot, len(c.tokens)) for c in plan.chunks]), restored=restored,
                            emptied=emptied)
        if status != 0:
            # "no KV room" (1): llama.cpp rolled the batch back, so a smaller retry may follow.
            # Any other failure may leave part of the batch in the cache: unknown until trimmed.
            # An interrupted one (2) took its cells out again, as llama.cpp does.
            if status not in (1, INTERRUPTED):
                self.stale.update(chunk.slot for chunk in plan.chunks)
            return result
        for chunk in plan.chunks:
            self.kv[chunk.slot].extend(chunk.tokens)
        for chunk in plan.chunks:
            if chunk.wants_logits and chunk.sample_apart and self.capabilities.can_sample_apart:
                job = FakeJob(self, chunk, detokenize(self.kv[chunk.slot]))
                with self._lock:
                    self.jobs.append(job)
                    self.flying[chunk.request_id] = job
                result.apart[chunk.slot] = job
                record.apart.append(chunk.slot)
            elif chunk.wants_logits and (chunk.n_draft or self.probs is not None):
                self._verify(chunk, result)
            elif chunk.wants_logits:
                if self.sample_delay is not None:  # inline: the whole tick waits for it
                    time.sleep(self.sample_delay(detokenize(self.kv[chunk.slot])))
                for slot, sampler in ((chunk.slot, chunk.sampler), *chunk.siblings):  # siblings: the same row
                    if sampler is not None and sampler.params.grammar == "STOPS" and sampler.emitted >= 2:
                        # a grammar that stops its answer mid-way (llguidance's limits): that request's error
                        result.failed[slot] = ("the grammar stopped the answer: fake", "invalid_request")
                        sampler.emitted += 1
                        continue
                    tok = self._sample(chunk, slot, sampler)
                    result.sampled[slot] = tok
                    if self.force is not None and tok != EOG and chunk.logprobs is None:
                        n = self.force(detokenize(sampler.reply[:sampler.emitted]))
                        forced = sampler.reply[sampler.emitted:sampler.emitted + n]
                        sampler.emitted += len(forced)
                        if forced:
                            result.forced[slot] = forced
                    if chunk.logprobs is not None:
                        result.logprobs[slot] = fake_logprobs(tok, chunk.logprobs)
        record.sampled = dict(result.sampled)
        result.sample_ms = 0.1
        return result

    def _verify(self, chunk: Any, result: StepResult) -> None:
        """A chunk's guesses (none for a plain row drawn from `probs`): rows in order, each
        guess kept while the row's own token is it; the first other token ends the chunk."""
        n = chunk.n_draft
        guesses = chunk.tokens[len(chunk.tokens) - n:]
        kept = 0
        for i in range(n + 1):
            guess = guesses[i] if i < n else None
            tok = self._draw(chunk, i) if self.probs is not None else self._sample(chunk, chunk.slot, chunk.sampler)
            if guess is not None and tok == guess:
                kept += 1
                continue
            break
        result.sampled[chunk.slot] = tok
        if n:
            result.accepted[chunk.slot] = kept
        if chunk.logprobs is not None:
            result.logprobs[chunk.slot] = fake_logprobs(tok, chunk.logprobs)
            result.accepted_logprobs[chunk.slot] = [fake_logprobs(g, chunk.logprobs) for g in guesses[:kept]]

    def _draw(self, chunk: Any, i: int) -> int:
        """Row i of the chunk's verified rows: one draw from the known distribution of what
        precedes it (`probs`) with the sampler's own generator, whatever was guessed there."""
        import numpy as np

        sampler = chunk.sampler
        if sampler.rng is None:
            sampler.rng = np.random.default_rng(sampler.seed)
        dist = self.probs(self.kv[chunk.slot][:chunk.start_pos + len(chunk.tokens) - chunk.n_draft + i])
        key = tuple(dist.items())
        if self._last_dist is None or self._last_dist[0] != key:  # most tests fix one distribution
            p = np.array(list(dist.values()), dtype=np.float64)
            self._last_dist = (key, list(dist), np.cumsum(p / p.sum()).tolist())
        _, ids, cumulative = self._last_dist
        return ids[min(bisect.bisect_right(cumulative, sampler.rng.random()), len(ids) - 1)]

    def accept_forced(self, sampler: Any, tokens: list[int]) -> None:
        """Tokens the engine wrote unsampled (a thinking budget's closer): recorded; a request whose
        grammar is "NO_CLOSE" scripts one whose grammar cannot take them. The scripted reply goes on
        where it was."""
        if sampler is not None and sampler.params.grammar == "NO_CLOSE":
            raise InvalidRequest("the grammar stopped the answer: fake NO_CLOSE")
        self.written.append(list(tokens))

    def valid_guesses(self, sampler: Any, tokens: list[int]) -> int:
        if self.grammar_allows is None or not (sampler.params.grammar or sampler.params.json_schema is not None):
            return len(tokens)
        return next((i for i, t in enumerate(tokens) if not self.grammar_allows(t)), len(tokens))

    def graph_runs(self, runs: list[tuple[int, int]]) -> int:
        return len(ubatch_sizes(runs, self.n_batch or 512, unified=self.capabilities.pool_cells is not None))

    def lose_window(self, slot: int, below: int) -> None:
        """A neighbour took `slot`'s window cells at positions below `below` (see `window`)."""
        self.lost_below[slot] = max(self.lost_below.get(slot, 0), below)

    def keep_floor(self, slot: int) -> int:
        lost = self.lost_below.get(slot, 0)
        return lost + self.window if lost else 0

    def _keeps(self, slot: int, n_keep: int) -> bool:
        """Whether continuing `slot` at n_keep finds its window cells (see `window`)."""
        return n_keep <= 0 or n_keep >= self.keep_floor(slot)

    def _apply_trims(self, plan: StepPlan) -> set[int]:
        emptied = set()
        for t in plan.trims:
            kv = self.kv[t.slot]
            if not 0 <= t.n_keep <= len(kv):
                self.violations.append(f"trim {t} but the slot holds {len(kv)} tokens")
            if t.n_keep > 0 and not self.capabilities.can_trim:
                self.violations.append(f"trim {t} keeps part of a slot on a runner that cannot (can_trim False)")
            if t.n_keep > 0 and t.slot in self.stale:
                self.violations.append(f"trim {t} keeps part of a slot a failed decode left unknown")
            if 0 < t.n_keep < self.floor.get(t.slot, 0):
                self.violations.append(f"trim {t} cuts a restored slot before its restored end {self.floor[t.slot]}")
            n_keep = t.n_keep if self._keeps(t.slot, t.n_keep) else 0
            if n_keep < t.n_keep:
                emptied.add(t.slot)  # as LlamaRunner: the cells it needed are gone, so it is emptied
            if n_keep <= 0:
                self.stale.discard(t.slot)
                self.floor.pop(t.slot, None)
                self.lost_below.pop(t.slot, None)
            del kv[max(n_keep, 0):]
            self.trims.append((t.slot, t.n_keep))
        return emptied

    def snapshot(self, slot: int) -> bytes:
        if slot in self.stale:
            self.violations.append(f"snapshot of slot {slot}, which a failed decode left unknown")
        self.snapshots.append((slot, len(self.kv[slot])))
        return FAKE_KV_MAGIC + array.array("i", self.kv[slot]).tobytes()

    def _apply_restores(self, plan: StepPlan) -> dict[int, bool]:
        took = {}
        for r in plan.restores:
            if not (self.capabilities.can_park if r.resume else self.capabilities.can_store):
                self.violations.append(f"restore into slot {r.slot} planned for a runner that cannot (can_store False)")
            if any(c.slot == r.slot for c in plan.chunks):
                self.violations.append(f"slot {r.slot} is restored and evaluated in the same plan")
            data = bytes(r.payload)
            ok = data.startswith(FAKE_KV_MAGIC) and self.restore_ok(r.slot)
            tokens = list(array.array("i", data[len(FAKE_KV_MAGIC):])) if ok else []
            if ok and len(tokens) != r.n_tokens:
                self.violations.append(f"restore into slot {r.slot} says {r.n_tokens} tokens, the bytes hold {len(tokens)}")
            self.kv[r.slot] = tokens if ok else []
            self.lost_below.pop(r.slot, None)
            n = len(self.kv[r.slot])
            whole = self.capabilities.restored_whole_below is not None and n < self.capabilities.restored_whole_below
            self.floor[r.slot] = 0 if whole else n
            self.stale.discard(r.slot)
            took[r.slot] = ok
            self.restores.append((r.slot, r.n_tokens, ok))
        return took

    def _apply_forks(self, plan: StepPlan, emptied: set[int]) -> None:
        sources = {f.src_slot for f in plan.forks}
        targets: set[int] = set()
        for f in plan.forks:
            if not self.capabilities.can_fork:
                self.violations.append(f"fork {f} planned for a runner that cannot fork")
            if f.src_slot == f.dst_slot or f.dst_slot in targets or f.dst_slot in sources:
                self.violations.append(f"fork {f}: a slot is copied onto itself, twice, or is also a source")
            if not 0 < f.n_tokens <= len(self.kv[f.src_slot]):
                self.violations.append(f"fork {f} but the source holds {len(self.kv[f.src_slot])} tokens")
            if f.src_slot in self.stale:
                self.violations.append(f"fork {f} copies a slot a failed decode left unknown")
            targets.add(f.dst_slot)
            self.stale.discard(f.dst_slot)
            if f.n_tokens < self.floor.get(f.src_slot, 0):
                self.violations.append(f"fork {f} cuts a restored slot before its restored end {self.floor[f.src_slot]}")
            self.forks.append((f.src_slot, f.dst_slot, f.n_tokens))
            if f.src_slot in emptied or not self._keeps(f.src_slot, f.n_tokens):
                self.kv[f.dst_slot] = []  # as LlamaRunner: a copy missing window cells is dropped
                self.floor.pop(f.dst_slot, None)
                emptied.add(f.dst_slot)
                continue
            emptied.discard(f.dst_slot)
            self.kv[f.dst_slot] = list(self.kv[f.src_slot][:f.n_tokens])
            self.floor[f.dst_slot] = self.floor.get(f.src_slot, 0)
            if self.lost_below.get(f.src_slot):
                self.lost_below[f.dst_slot] = self.lost_below[f.src_slot]

    def _apply_moves(self, plan: StepPlan, emptied: set[int]) -> None:
        others = {t.slot for t in plan.trims} | {r.slot for r in plan.restores} | \
            {f.src_slot for f in plan.forks} | {f.dst_slot for f in plan.forks}
        ends: set[int] = set()
        for m in plan.moves:
            if self.capabilities.pool_cells is not None or not self.capabilities.can_fork:
                self.violations.append(f"move {m} planned with one KV cache the slots share, or no forks")
            if m.src_slot == m.dst_slot or {m.src_slot, m.dst_slot} & (ends | others):
                self.violations.append(f"move {m}: a slot another change of the plan touches")
            if len(self.kv[m.src_slot]) != m.n_tokens:
                self.violations.append(f"move {m} but the source holds {len(self.kv[m.src_slot])} tokens")
            if m.src_slot in self.stale:
                self.violations.append(f"move {m} copies a slot a failed decode left unknown")
            if not any(c.slot == m.dst_slot for c in plan.chunks):
                self.violations.append(f"move {m} in a plan without the moved request's chunk (no decode copies it)")
            ends |= {m.src_slot, m.dst_slot}
            self.moves.append((m.src_slot, m.dst_slot, m.n_tokens))
            if not self.move_ok(m.dst_slot):
                self.kv[m.dst_slot] = []
                self.floor.pop(m.dst_slot, None)
                emptied.add(m.dst_slot)
                continue
            self.stale.discard(m.dst_slot)
            self.kv[m.dst_slot] = list(self.kv[m.src_slot])
            self.floor[m.dst_slot] = self.floor.get(m.src_slot, 0)

    def _check(self, plan: StepPlan) -> None:
        if self.n_batch is not None and plan.n_tokens > self.n_batch:
            self.violations.append(f"plan of {plan.n_tokens} tokens exceeds n_batch {self.n_batch}")
        seen = set()
        for chunk in plan.chunks:
            with self._lock:
                if chunk.request_id in self.flying:
                    self.violations.append(f"request {chunk.request_id} evaluated a chunk while its token was sampled apart")
            if chunk.slot in seen:
                self.violations.append(f"slot {chunk.slot} appears twice in one plan")
            seen.add(chunk.slot)
            if not chunk.tokens:
                self.violations.append(f"empty chunk for slot {chunk.slot}")
            if chunk.slot in self.stale:
                self.violations.append(f"slot {chunk.slot}: chunk evaluated after a failed decode, "
                                       "before a trim emptied the slot")
            if chunk.start_pos != len(self.kv[chunk.slot]):
                self.violations.append(f"slot {chunk.slot}: chunk starts at {chunk.start_pos} but the cache "
                                       f"holds {len(self.kv[chunk.slot])} tokens")
            if chunk.start_pos + len(chunk.tokens) > self.slot_ctx:
                self.violations.append(f"slot {chunk.slot}: chunk runs past slot_ctx {self.slot_ctx}")
            if chunk.wants_logits and chunk.sampler is None:
                self.violations.append(f"slot {chunk.slot}: chunk wants logits but carries no sampler")
            if not chunk.wants_logits and (chunk.sampler is not None or chunk.logprobs is not None):
                self.violations.append(f"slot {chunk.slot}: chunk samples nothing but carries a sampler or logprobs")
        if self.capabilities.pool_cells is not None:
            after = {slot: len(tokens) for slot, tokens in enumerate(self.kv)}
            for chunk in plan.chunks:
                after[chunk.slot] = chunk.start_pos + len(chunk.tokens)
            if sum(after.values()) > self.capabilities.pool_cells:
                self.violations.append(f"the slots would hold {sum(after.values())} tokens, more than the pool's "
                                       f"{self.capabilities.pool_cells}")

    def _sample(self, chunk: Any, slot: int, sampler: Any, context: str | None = None) -> int:
        if sampler is None:
            return EOG
        if sampler.freed:
            self.violations.append(f"slot {slot} sampled with a freed sampler")
        if sampler.reply is None:
            # the row's context (siblings share it); a FakeJob took it when the row was evaluated
            sampler.prompt_text = context if context is not None else detokenize(self.kv[chunk.slot])
            reply = (self.reply(sampler.prompt_text, sampler.seed) if self.reply_takes_seed
                     else self.reply(sampler.prompt_text))
            sampler.reply = text_tokens(reply) if isinstance(reply, str) else list(reply)
        if sampler.emitted < len(sampler.reply):
            tok = sampler.reply[sampler.emitted]
        else:
            tok = EOG
        if tok == EOG and (sampler.params.ignore_eos or chunk.suppress_eog):
            tok = FILL
        sampler.emitted += 1
        return tok

    def embed(self, batch: EmbedBatch) -> EmbedStepResult:
        if self.embed_delay:
            time.sleep(self.embed_delay)
        status = self.embed_status.get(len(self.embed_batches) + 1, 0)
        self.embed_batches.append((copy.deepcopy(batch), status))
        if batch.n_tokens > self.embed_max_tokens or len(batch.inputs) > self.embed_max_seqs or not batch.inputs:
            self.violations.append(f"embed batch of {len(batch.inputs)} inputs, {batch.n_tokens} tokens "
                                   f"(bounds {self.embed_max_seqs}, {self.embed_max_tokens})")
        for tokens in batch.inputs:
            if not tokens or any(not 0 <= t < self.n_vocab for t in tokens):
                self.violations.append(f"embed input {tokens!r} is empty or outside the vocabulary")
        if status != 0:
            return EmbedStepResult(status=status)
        return EmbedStepResult(vectors=[fake_embedding(t, batch.pooling) for t in batch.inputs], eval_ms=0.1)

    def close(self) -> None:
        self.close_calls += 1

    # -- helpers for tests ---------------------------------------------------------------

    def plans_with(self, request_id: int) -> list[ExecutedPlan]:
        return [p for p in self.plans if any(c.request_id == request_id for c in p.plan.chunks)]


class FakeJob:
    """A row sampled apart (plan.SampleJob): sleeps the request's sample_delay in small steps,
    giving up when `stop()` says so, then samples like the inline path from the context the
    row had when it was evaluated."""

    def __init__(self, runner: FakeRunner, chunk: Any, context: str):
        self.runner = runner
        self.chunk = chunk
        self.context = context
        self.samplers = [chunk.sampler, *(sm for _, sm in chunk.siblings)]
        self.stopped = False
        self.ran = False

    def run(self, stop: Callable[[], bool]) -> tuple[dict[int, int], dict[int, dict]]:
        runner, chunk = self.runner, self.chunk
        try:
            if self.ran:
                runner.violations.append(f"request {chunk.request_id}: a job ran twice")
            self.ran = True
            end = time.perf_counter() + (runner.sample_delay(self.context) if runner.sample_delay else 0.0)
            while time.perf_counter() < end:
                if stop():
                    self.stopped = True
                    raise SampleStopped()
                time.sleep(0.002)
            sampled, logprobs = {}, {}
            for slot, sampler in ((chunk.slot, chunk.sampler), *chunk.siblings):
                tok = runner._sample(chunk, slot, sampler, self.context)
                sampled[slot] = tok
                if chunk.logprobs is not None:
                    logprobs[slot] = fake_logprobs(tok, chunk.logprobs)
            return sampled, logprobs
        finally:
            with runner._lock:
                runner.flying.pop(chunk.request_id, None)


def gated_at_first_call() -> tuple[threading.Event, Callable[[int, StepPlan], None]]:
    """A hook holding the engine in its first execute until the event is set: everything
    submitted meanwhile is queued together."""
    gate = threading.Event()

    def hook(call: int, plan: StepPlan) -> None:
        if call == 1:
            assert gate.wait(10)

    return gate, hook
