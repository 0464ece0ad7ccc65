"""The scheduler: what each tick runs, behind one facade the engine calls. Never imports llama_cpp.

Three parts do the work, each in its own module:
- kv_ledger.py, what each slot's KV cache holds and the trims, forks and restores the next
  plan carries;
- admission.py, the waiting queue: who gets which idle slot, fair share, reserved slots,
  preemption and parking;
- output_step.py, the tokens a tick sampled joining their answers (detokenized, stopped).
Each tick the engine calls admit() and start() for each admission, schedule() for the plan,
and update() with what the runner did; prefix_saves.py says which slots to save to the disk
prefix store. Token bytes and end-of-generation checks come in as callables so tests can drive
it with a scripted fake vocabulary.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from .admission import Admission, AdmissionQueue, slots_wanted, urgent_rows_only
from ..drafts import Drafter
from .kv_ledger import MOVE_CELLS, MOVE_MIN_LEFT, KVLedger
from .output_step import OutputStep, SeqEvent
from ..plan import Chunk, Fork, StepPlan, StepResult, Trim
from .policies import POLICIES
from .prefix_saves import PrefixSaves, PrefixToSave
from ..sequence import Sequence, Status

if TYPE_CHECKING:
    from ..prefixes.disk_prefix import DiskPrefixes
    from ..speculation import Speculation


class Scheduler:
    def __init__(self, n_slots: int, slot_ctx: int, n_batch: int, chunk_size: int, policy: str,
                 cache_prompt: bool, token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool],
                 fork_min_tokens: int = 0, cache_generated: bool = True,
                 sample_apart: Callable[[Sequence], bool] | None = None, disk: "DiskPrefixes | None" = None,
                 speculation: "Speculation | None" = None, pool_cells: int | None = None,
                 park: Callable[[int], Any] | None = None, park_budget: int = 1 << 30, reserved: int = 0,
                 restored_whole_below: int | None = None, keep_floor: Callable[[int], int] | None = None,
                 moves: bool = False, take_forced: Callable[[Any, list[int]], None] | None = None,
                 max_decode_rows: int | None = None):
        self.ledger = KVLedger(n_slots, slot_ctx, cache_generated, pool_cells, keep_floor, restored_whole_below,
                               park, park_budget)
        self.saves = PrefixSaves(disk, self.ledger.slots)
        self.queue = AdmissionQueue(self.ledger, self.saves, cache_prompt, fork_min_tokens, reserved, disk)
        self.output = OutputStep(self.ledger, token_bytes, is_eog, self.finish, take_forced)
        # the rows a generating slot's chunk may take (RunnerCapabilities.max_decode_rows): tokens the
        # engine wrote (a thinking block's closer) beyond them are evaluated over the next ticks
        self.max_decode_rows = max_decode_rows
        self.slots = self.ledger.slots
        self.waiting = self.queue.waiting
        self.reserved = reserved  # the settings as given, for stats and tests
        self.fork_min_tokens = fork_min_tokens
        self.cache_generated = cache_generated
        self.slot_ctx = slot_ctx
        self.n_batch = n_batch
        self.chunk_size = chunk_size
        self.policy = POLICIES[policy]
        self.disk = disk
        # Which requests' rows are sampled apart from the tick (sampling_threads.py); None: all inline.
        self.sample_apart = sample_apart
        # Speculative decoding (speculation.py): guesses in the rows a tick has to spare. None: off.
        self.speculation = speculation
        # No holes (KVLedger.plan_moves): only with a KV stream per slot; one shared cache has none.
        self.moves = moves and pool_cells is None
        self._admitted = 0
        self._timed: list[Sequence] = []  # unfinished sequences with a deadline

    # -- the queue ---------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.queue.enqueue(seq)
        if seq.clock.deadline is not None:
            self._timed.extend(seq.members)  # the samples of an n-request share one deadline

    def expired(self, now: float) -> list[Sequence]:
        """Unfinished sequences (waiting or running) whose deadline has passed at `now`;
        the caller ends them with finish_reason 'timeout'."""
        if not self._timed:
            return []
        self._timed = [s for s in self._timed if not s.finished]
        return [s for s in self._timed if now >= s.clock.deadline]  # type: ignore[operator]

    def next_deadline(self) -> float | None:
        """The earliest deadline of an unfinished sequence (perf_counter time), or None."""
        return min((s.clock.deadline for s in self._timed if not s.finished), default=None)  # type: ignore[type-var]

    @property
    def running(self) -> list[Sequence]:
        return [s.seq for s in self.slots if s.seq is not None]

    @property
    def parked_bytes(self) -> int:
        return self.ledger.parked_bytes

    def has_work(self) -> bool:
        """Whether a tick could do anything: a slot with tokens to evaluate (not one waiting
        for a token sampled apart, nor a sample waiting for its fork), or a queued request
        and an idle slot for it. Without it the engine thread sleeps instead of spinning."""
        idle = 0
        for slot in self.slots:
            seq = slot.seq
            if seq is None:
                idle += 1
            elif seq.status in (Status.PREFILLING, Status.GENERATING) and not seq.sampling_apart:
                return True
        # an n-request at the head of the queue needs n idle slots (nothing overtakes it), and in
        # a pool the room it may come to hold
        if not self.waiting or idle < slots_wanted(self.waiting[0]):
            return False
        kept = sum(len(s.cached) for s in self.slots if s.seq is None)  # idle caches give way
        return self.ledger.room_left() + kept >= self.ledger.reserved_for(self.waiting[0])

    def admit(self) -> list[Admission]:
        """Give idle slots to waiting requests (AdmissionQueue.admit); call `start` for each."""
        return self.queue.admit()

    def take_preempted(self) -> list[Sequence]:
        """The requests parked since the last call (the engine counts them as waiting again)."""
        return self.queue.take_preempted()

    def start(self, seq: Sequence, slot_id: int, kept: int) -> None:
        """The slot's KV now holds exactly `kept` tokens of seq's prompt prefix (or, when admission
        planned a Restore for it, what that Restore gives; its first chunk comes after that)."""
        restoring = slot_id in self.ledger.restoring
        slot = self.slots[slot_id]
        if seq.kv.parked is not None:  # resumed: its own state stays; its KV comes back by the Restore
            slot.seq, seq.kv.slot = seq, slot_id
            seq.status = Status.RESTORING
            if not restoring:
                self.ledger.resumed(seq, slot, False)
            return
        slot.cached = slot.cached[:kept]
        slot.seq = seq
        seq.kv.slot = slot_id
        seq.kv.num_computed = seq.kv.num_cached = kept
        # samples 1..n-1 of an n-request wait for sample 0's prompt instead of evaluating it
        seq.status = Status.FORKING if seq.index else Status.RESTORING if restoring else Status.PREFILLING
        self.saves.mark_prompt(seq)
        if self.speculation is not None and self.speculation.drafts_for(seq):
            seq.drafter = Drafter(seq.prompt, seq.prediction)
        seq.clock.admitted_at = time.perf_counter()
        seq.queue.admit_order = self._admitted
        self._admitted += 1
        self.output.begin(seq)

    # -- one tick --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """The next tick's plan: every generating row, prompt chunks within the tick's budget
        (higher priority first), guesses in the rows to spare, and the KV changes decided."""
        running = [s for s in self.running if not s.sampling_apart]  # those wait for their token
        decodes = [s for s in running if s.status == Status.GENERATING]
        refilled = self.ledger.refilled()
        prefills = [s for s in running if s.status == Status.PREFILLING and not self.saves.sits_out(s, refilled)]
        prefills.sort(key=lambda s: (s.params.priority, s.queue.admit_order))
        decodes, prefills = urgent_rows_only(decodes, prefills)
        allocation = self.policy(decodes, prefills, self.n_batch, self.chunk_size, lambda s: s.num_pending)
        if self.max_decode_rows is not None:
            allocation = [(seq, min(n, self.max_decode_rows) if seq.status == Status.GENERATING else n)
                          for seq, n in allocation]
        if self.moves:  # before the chunks: they go to the slots the moves give
            min_left = MOVE_MIN_LEFT * -(-self.slot_ctx // MOVE_CELLS)  # the copy grows with the stream
            self.ledger.plan_moves({seq.kv.slot for seq, n in allocation if n > 0}, min_left,  # type: ignore[misc]
                                   time.perf_counter(), len(self.slots) - self.reserved)
        # In slot order: with a KV stream per slot, llama.cpp puts rows of consecutive slot ids in
        # one ubatch (kernel_paths/ubatch_split.py; docs/performance.md, "Scheduler notes").
        chunks = sorted((self._chunk(seq, n) for seq, n in allocation), key=lambda c: c.slot)
        spare = self.n_batch - sum(len(c.tokens) for c in chunks)
        if self.speculation is not None and spare > 0:
            self.speculation.add_guesses(chunks, lambda slot: self.slots[slot].seq, spare,  # type: ignore[arg-type,return-value]
                                         self.chunk_size, self.slot_ctx)
        return StepPlan(chunks, *self.ledger.take_changes())

    def _chunk(self, seq: Sequence, n: int) -> Chunk:
        """seq's next `n` tokens (cut where a prefix to save ends), and how to sample after them."""
        n = self.saves.chunk_end(seq, n)
        wants_logits = seq.kv.num_computed + n == seq.num_tokens
        siblings = [(s.kv.slot, s.sampler) for s in seq.members[1:] if s.status == Status.FORKING] \
            if wants_logits and seq.group is not None and seq.status == Status.PREFILLING else []
        return Chunk(slot=seq.kv.slot, request_id=seq.request_id, tokens=seq.pending_tokens(n),  # type: ignore[arg-type]
                     start_pos=seq.kv.num_computed, wants_logits=wants_logits,
                     is_decode=seq.status == Status.GENERATING,
                     suppress_eog=len(seq.answer.output) < seq.params.min_tokens,
                     sampler=seq.sampler if wants_logits else None,
                     logprobs=seq.params.logprobs if wants_logits else None, siblings=siblings,
                     sample_apart=wants_logits and self.sample_apart is not None and self.sample_apart(seq))

    @staticmethod
    def shrink(plan: StepPlan) -> StepPlan | None:
        """The plan to try after `plan` found no room in the KV cache (llama_decode status 1):
        first the decode tokens alone (prefill waits for a later tick), then half the chunks.
        None when there is nothing smaller to try (a single chunk): that chunk fails. The
        smaller plan carries no trims or forks: the runner applied them before the failed decode."""
        if len(plan.chunks) <= 1:
            return None
        decodes = [c for c in plan.chunks if c.is_decode]
        if 0 < len(decodes) < len(plan.chunks):
            return StepPlan(decodes)
        return StepPlan(plan.chunks[: len(plan.chunks) // 2])

    def update(self, plan: StepPlan, result: StepResult) -> list[SeqEvent]:
        """Account for an evaluated plan: KV bookkeeping, new tokens, stops, finishes."""
        events = []
        for slot_id, ok in result.restored.items():
            self.ledger.take_restore(slot_id, ok)
        for slot_id in result.emptied:
            self.ledger.emptied(slot_id)
        for chunk in plan.chunks:
            seq = self.slots[chunk.slot].seq
            if seq is None or seq.request_id != chunk.request_id:
                continue  # finished (cancelled) while the tick ran
            self.ledger.evaluated(chunk, seq, result)
            self.saves.reached(seq, chunk)
            if chunk.wants_logits and chunk.slot in result.apart:
                seq.sampling_apart = True  # no chunk for it until its token lands (accept_apart)
                continue
            events += self.output.take_row(chunk, seq, result.sampled, result.logprobs, result.forced,
                                           result.accepted, result.accepted_logprobs)
        self.saves.take_waiting(plan)
        return events

    def accept_apart(self, chunk: Chunk, sampled: dict[int, int], logprobs: dict[int, dict]) -> list[SeqEvent]:
        """Take the tokens a SampleJob sampled for `chunk`'s row (and its siblings), as `update`
        takes inline ones. The caller checks the request has not ended meanwhile."""
        seq = self.slots[chunk.slot].seq
        if seq is None or seq.request_id != chunk.request_id:
            return []
        seq.sampling_apart = False
        return self.output.take_row(chunk, seq, sampled, logprobs, {})  # masked grammars (forced tokens) sample inline

    def take_saves(self) -> list[PrefixToSave]:
        """The slots to snapshot into the disk prefix store now (each holds exactly its tokens)."""
        return self.saves.take()

    # -- endings and KV changes from outside ----------------------------------------------------

    def finish(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> tuple[str, str]:
        """Give seq its terminal status and free its slot. Returns any held-back (text, reasoning)."""
        tail = self.output.end(seq, reason)
        seq.status = Status.FINISHED
        seq.queue.queued = False
        if seq.kv.parked is not None:  # ended while put aside: its copy goes
            self.ledger.unpark_bytes(seq.kv.parked)
            seq.kv.parked = None
        seq.clock.finished_at = time.perf_counter()
        if seq.clock.paused_at is not None:  # ended while put aside (or before its restore ran): that pause counts
            seq.clock.paused_ms += (seq.clock.finished_at - seq.clock.paused_at) * 1000
            seq.clock.paused_at = None
        seq.drafter = None  # its index of the prompt and answer is not needed any more
        seq.answer.finish_reason = reason
        seq.answer.error, seq.answer.error_code = error, code
        if seq.kv.slot is not None:
            self.ledger.release(seq, seq.clock.finished_at)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        return tail

    def forget_slot(self, slot_id: int) -> None:
        """After a failed decode the slot's KV is not known: empty it, by a Trim that the next
        plan carries (the failed plan has run; until then the slot is idle and, not being
        busy, never a fork source, so nothing reads the stale cells)."""
        self.ledger.trim(slot_id, 0)

    def fork(self, src_slot: int, dst_slot: int, n_tokens: int) -> Fork:
        """Decide a KV fork for the next plan (KVLedger.fork)."""
        return self.ledger.fork(src_slot, dst_slot, n_tokens)

    def trim(self, slot_id: int, n_keep: int) -> Trim:
        """Decide a KV trim for the next plan (KVLedger.trim)."""
        return self.ledger.trim(slot_id, n_keep)
