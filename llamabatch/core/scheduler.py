"""Slots, the waiting queue, admission and the per-tick plan. Never imports llama_cpp.

The scheduler owns what runs next: who gets a slot, who gets how many tokens this tick,
which requests are past their deadline, and the smaller plan to try when llama_decode
finds no KV room. It is also the one owner of "what is in each slot's KV cache"
(`Slot.cached`): every change to a slot's KV it decides (plan.Trim, plan.Fork) rides on the
next StepPlan, and the runner applies them there. Token bytes and end-of-generation checks
come in as callables so tests can drive it with a scripted fake vocabulary.
"""
from __future__ import annotations

import bisect
import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from .detok import IncrementalDetokenizer
from .drafts import Drafter
from .plan import Chunk, Fork, Restore, StepPlan, StepResult, Trim
from .policies import POLICIES
from .prefix import SlotView, choose_slot, longest_shared
from .sequence import Sequence, Status

if TYPE_CHECKING:
    from .disk_prefix import DiskPrefixes
    from .speculation import Speculation


@dataclass(eq=False)
class Slot:
    slot_id: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV sits in this slot, by position
    last_used: float = 0.0
    # The shortest prefix of its tokens the slot can keep. A slot restored from the disk prefix
    # store (or forked from one) keeps one only from the restored end on: llama.cpp restores just
    # the last n_swa positions of Gemma 3's window layers (plan.Restore); and in a cache the slots
    # share, neighbours may take its early window cells (Runner.keep_floor). 0: any prefix.
    floor: int = 0
    seq: Sequence | None = None

    @property
    def state(self) -> str:
        if self.seq is None:
            return "idle"
        return "generating" if self.seq.status == Status.GENERATING else "prefilling"


@dataclass
class SeqEvent:
    """What a tick did to one sequence: text to stream and whether it just finished."""

    seq: Sequence
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    forced: int = 0  # of `tokens`, those its grammar forced (unsampled)
    accepted: int = 0  # of `tokens`, draft tokens its verification kept (core/drafts.py)


class Admission(NamedTuple):
    """A waiting request given a slot. `reuse` prompt tokens are already there: from the
    slot's own cache (a Trim in the next plan drops the rest), or, when `fork` is set,
    copied from another slot by that Fork in the next plan (nothing to trim). A slot the next
    plan restores from the disk prefix store comes with reuse 0: Scheduler.update takes what
    the Restore gave."""

    seq: Sequence
    slot: int
    reuse: int
    fork: Fork | None = None


@dataclass
class SaveWanted:
    """A slot that holds exactly `tokens` (a prefix worth keeping) after the tick that just ran:
    the engine snapshots it into the disk prefix store before the next plan changes it."""

    seq: Sequence
    slot: int
    tokens: list[int]


@dataclass
class Parked:
    """A preempted request's place, kept while it waits: its slot's KV as bytes (None when the
    snapshot failed: it is evaluated again), how many positions they hold, which of them the
    slot's prefix cache may reuse, and the status it resumes with."""

    payload: Any
    n_cells: int
    cached: list[int]
    status: Status


# Priority's guard against starvation: once the oldest waiting request has watched this many
# admissions of others go ahead of it, it is admitted next whatever its priority, and it is
# never preempted (a steady stream of higher-priority requests still leaves it every 9th slot).
FAIR_SHARE = 8


def running_samples(seq: Sequence) -> list[Sequence]:
    """The samples of seq's request that have not ended (an n-request's end one by one)."""
    return [m for m in seq.members if not m.finished]


def slots_wanted(seq: Sequence) -> int:
    """The slots a queued request takes at once: one a sample; for one put aside, one for each
    sample it put aside (its samples that had ended stay ended)."""
    if seq.parked is None:
        return len(seq.members)
    return sum(1 for m in seq.members if m.parked is not None)


def priority_key(seq: Sequence) -> tuple[int, int]:
    """Who goes first: lower priority value, then arrival (request ids are given in order)."""
    return (seq.params.priority, seq.request_id)


class Scheduler:
    def __init__(self, n_slots: int, slot_ctx: int, n_batch: int, chunk_size: int, policy: str,
                 cache_prompt: bool, token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool],
                 fork_min_tokens: int = 0, cache_generated: bool = True,
                 sample_apart: Callable[[Sequence], bool] | None = None, disk: "DiskPrefixes | None" = None,
                 speculation: "Speculation | None" = None, pool_cells: int | None = None,
                 park: Callable[[int], Any] | None = None, park_budget: int = 1 << 30, reserved: int = 0,
                 restored_whole_below: int | None = None, keep_floor: Callable[[int], int] | None = None):
        self.slots = [Slot(i) for i in range(n_slots)]
        # What the runner can still keep of each slot (Runner.keep_floor): in a cache the slots
        # share, a neighbour's work may take an idle slot's early window cells at any tick.
        self.keep_floor = keep_floor
        # Slots only a request above the default priority may take (EngineConfig.reserved_slots):
        # requests at priority 0 or below run in the others, so an urgent arrival beside a full
        # batch takes a free slot instead of putting a batch request aside (_park).
        self.reserved = reserved
        # Preemption: park(slot) gives the slot's KV as bytes (runner.snapshot), put back by a
        # Restore(resume=True) when the request resumes. None: a request waits for a free slot.
        self.park = park
        # Bytes of parked KV held at once: past it a preempted request's copy is dropped and it is
        # evaluated again when it resumes (the engine passes the KV cache's own size).
        self.park_budget = park_budget
        self.parked_bytes = 0
        # A slot restored (parked request or store entry) with fewer tokens than this may be cut
        # back anywhere (Runner.restored_whole_below); else only from its restored end (its floor).
        self.restored_whole_below = restored_whole_below
        self.preempted: list[Sequence] = []  # parked since the engine last took them (take_preempted)
        self._arrivals: list[tuple[int, int, Sequence]] = []  # heap by request id: the oldest waiting request
        self._pushed = 0
        self._passed = 0  # admissions that went ahead of the oldest waiting request (FAIR_SHARE)
        self._oldest: Sequence | None = None
        # A KV pool the slots share (a unified cache): a request may hold up to slot_ctx of its
        # cells and is admitted only when what it may come to hold fits beside what the others
        # may (admission by room, _make_room). None: a stream of slot_ctx cells per slot.
        self.pool_cells = pool_cells
        self.waiting: deque[Sequence] = deque()
        self.slot_ctx = slot_ctx
        self.n_batch = n_batch
        self.chunk_size = chunk_size
        self.policy = POLICIES[policy]
        self.cache_prompt = cache_prompt
        # Deterministic mode reuses only KV that prefill computed: a generated token's KV comes
        # from the decode path, which rounds differently from evaluating it as prompt.
        self.cache_generated = cache_generated
        self.token_bytes = token_bytes
        self.is_eog = is_eog
        self._detok: dict[Sequence, IncrementalDetokenizer] = {}  # by sequence: the n samples share an id
        self._admitted = 0
        self._timed: list[Sequence] = []  # unfinished sequences with a deadline
        # Prefix sharing across slots: a prompt sharing at least this many tokens with what
        # another slot holds (or is evaluating) gets them by a KV fork. 0 = off.
        self.fork_min_tokens = fork_min_tokens
        self._forks: list[Fork] = []  # decided, not yet handed to the runner in a plan
        self._trims: list[Trim] = []  # likewise; a plan applies its trims before its forks
        # Which requests' rows are sampled apart from the tick (sampling_threads.py); None: all inline.
        self.sample_apart = sample_apart
        # The disk prefix store (disk_prefix.py): admission restores from it, and a prefix two
        # requests share is saved to it once. None: off.
        self.disk = disk
        self._restoring: dict[int, list[int]] = {}  # slot -> the tokens its planned Restore brings
        self._resuming: set[int] = set()  # slots whose planned Restore puts a parked request's KV back
        self._restores: list[Restore] = []  # decided, not yet handed to the runner in a plan
        self._saves: list[SaveWanted] = []  # slots holding a prefix to save, after the last update
        # Speculative decoding (speculation.py): guesses in the rows a tick has to spare. None: off.
        self.speculation = speculation

    # -- queue and admission -------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self._enqueue(seq)
        if seq.deadline is not None:
            self._timed.extend(seq.members)  # the samples of an n-request share one deadline

    def _enqueue(self, seq: Sequence) -> None:
        """Into the queue by (priority, arrival): after every request that goes before it."""
        key = priority_key(seq)
        if not self.waiting or priority_key(self.waiting[-1]) <= key:
            self.waiting.append(seq)  # the common case (one priority): the end
        else:
            self.waiting.insert(bisect.bisect_right(self.waiting, key, key=priority_key), seq)
        # the count breaks ties between entries of equal request ids (Sequences do not compare)
        self._pushed += 1
        heapq.heappush(self._arrivals, (seq.request_id, self._pushed, seq))
        seq.queued = True

    def _oldest_waiting(self) -> Sequence | None:
        while self._arrivals and not (self._arrivals[0][2].queued and self._arrivals[0][2].status == Status.WAITING):
            heapq.heappop(self._arrivals)  # admitted or ended since (a parked one is pushed again)
        return self._arrivals[0][2] if self._arrivals else None

    def _fair_share(self) -> None:
        """Put the oldest waiting request at the head when FAIR_SHARE admissions went ahead of it."""
        oldest = self._oldest_waiting()
        if oldest is not self._oldest:
            self._oldest, self._passed = oldest, 0
        if oldest is None or self._passed < FAIR_SHARE or self.waiting[0] is oldest:
            return
        if oldest not in self.waiting:
            return  # held back in this admission (it waits for a prefix another slot evaluates)
        self.waiting.remove(oldest)
        self.waiting.appendleft(oldest)
        oldest.protected = True

    def _admitted_one(self, seq: Sequence) -> None:
        seq.queued = False
        if seq is self._oldest:
            self._oldest, self._passed = None, 0
        else:
            self._passed += 1

    def expired(self, now: float) -> list[Sequence]:
        """Unfinished sequences (waiting or running) whose deadline has passed at `now`;
        the caller ends them with finish_reason 'timeout'."""
        if not self._timed:
            return []
        self._timed = [s for s in self._timed if not s.finished]
        return [s for s in self._timed if now >= s.deadline]  # type: ignore[operator]

    def next_deadline(self) -> float | None:
        """The earliest deadline of an unfinished sequence (perf_counter time), or None."""
        return min((s.deadline for s in self._timed if not s.finished), default=None)  # type: ignore[type-var]

    @property
    def running(self) -> list[Sequence]:
        return [s.seq for s in self.slots if s.seq is not None]

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
        return self._room_left() + kept >= self.reserved_for(self.waiting[0])

    def admit(self) -> list[Admission]:
        """Give idle slots to waiting requests, in priority order, then arrival. Each admission's KV change (a Trim of the
        slot's own cache to what the prompt reuses, or a Fork) rides on the next plan; the
        caller then calls `start` for each Admission.

        With prefix sharing on, a request whose prompt shares a prefix with what another
        busy slot holds gets it by a fork when that saves at least `fork_min_tokens` tokens over
        the best idle slot's own cache. If another slot is still evaluating a prompt that
        shares more (by at least `fork_min_tokens` over the idle slot's cache), the request stays
        in the queue (requests behind it may go first) and is admitted by a fork once that
        part is evaluated, instead of evaluating it a second time.

        With the disk prefix store on, a request no slot can give a longer prefix is restored
        from the store's longest entry that starts its prompt (a Restore in the next plan), and
        a prefix of at least `disk.save_min` tokens that two requests share is marked to be
        saved (see _mark_save and _take_waiting_saves)."""
        out: list[Admission] = []
        if self.waiting:
            self._refresh_floors()
        # a slot that a planned fork reads or fills keeps its KV until that plan has run
        pinned = {f.src_slot for f in self._forks} | {f.dst_slot for f in self._forks}
        idle = [s for s in self.slots if s.seq is None and s.slot_id not in pinned]
        held: list[Sequence] = []
        fresh: set[int] = set()  # slots handed out in this call: not yet trimmed, so no fork source
        while self.waiting:
            self._fair_share()
            if idle and not self._open_to(self.waiting[0], idle):
                self._urgent_first()  # only reserved slots are free: an urgent request behind the head takes one
            open_slots = self._open_to(self.waiting[0], idle)
            if slots_wanted(self.waiting[0]) > len(open_slots):
                # an n-request takes n slots at once; in order, so nothing overtakes it meanwhile
                if not self._preempt_for(self.waiting[0], idle):
                    break  # in order: what is behind it goes no sooner
                open_slots = self._open_to(self.waiting[0], idle)
                if slots_wanted(self.waiting[0]) > len(open_slots):
                    break
            if not self._make_room(self.waiting[0], idle):
                break  # a pool without room for it yet: in order, it waits for running requests to end
            seq = self.waiting.popleft()
            if seq.parked is not None:
                self._admitted_one(seq)
                out.extend(self._resume(seq, idle, fresh, open_slots))
                continue
            views = [SlotView(s.slot_id, s.cached, s.last_used) for s in open_slots]
            slot_id, reuse = choose_slot(seq.prompt, views, cache_prompt=self.cache_prompt)
            if reuse < self.slots[slot_id].floor:
                reuse = 0  # it cannot be cut back that far: emptied and evaluated
            fork = None
            if self.fork_min_tokens:
                busy = [s for s in self.slots if s.seq is not None]
                src, n = longest_shared(seq.prompt, [(s.slot_id, s.cached) for s in busy if s.slot_id not in fresh])
                if src is not None and n < self.slots[src].floor:
                    src, n = None, 0  # its copy could not be cut back to n
                maker, coming = longest_shared(seq.prompt, [(s.slot_id, s.seq.prompt) for s in busy])
                if coming > n and coming - reuse >= self.fork_min_tokens:
                    self._mark_save(self.slots[maker].seq, coming)  # type: ignore[arg-type]
                    held.append(seq)  # another slot is evaluating our prefix: wait for all of it
                    continue
                if src is not None and n - reuse >= self.fork_min_tokens:
                    fork, reuse = self.fork(src, slot_id, n), n
            self._admitted_one(seq)  # admitted now (a request held back above is not)
            out.extend(self._seat(seq, slot_id, reuse, fork, idle, fresh, open_slots))
        self.waiting.extendleft(reversed(held))
        if self.disk is not None and self.waiting:
            self._mark_queued_saves()
        return out

    def _refresh_floors(self) -> None:
        """Raise each slot's floor to what the runner can still keep of it, before admission
        chooses what a new request reuses or forks (nothing changes the cache until the plan)."""
        if self.keep_floor is None:
            return
        for slot in self.slots:
            if slot.cached and slot.slot_id not in self._restoring:
                slot.floor = max(slot.floor, self.keep_floor(slot.slot_id))

    def _seat(self, seq: Sequence, slot_id: int, reuse: int, fork: Fork | None, idle: list,
              fresh: set[int], open_slots: list[Slot]) -> list[Admission]:
        """Seat an admitted request in `slot_id` (and an n-request's other samples in the least
        recently used of the idle slots open to it): the slot's KV change (a restore from the
        disk store, a trim to what it reuses, or the fork) rides on the next plan."""
        hit = self.disk.lookup(seq.prompt, longer_than=reuse) if fork is None and self.disk is not None else None
        slot = self.slots[slot_id]
        idle.remove(slot)
        fresh.add(slot_id)
        slot.seq = seq  # reserved now so the same slot is not handed out twice
        if hit is not None:
            slot.cached = []  # what the restore brings is known only once it has run (update)
            self._restores.append(Restore(slot_id, len(hit.tokens), hit.payload))
            self._restoring[slot_id] = hit.tokens
            reuse = 0
        else:
            if fork is None:
                self.trim(slot_id, reuse)
            # A prefix worth keeping that its first slot went past: the trimmed cache or the
            # forked copy holds exactly it once this tick's plan has run. The request sits
            # that tick out and the slot is saved then (_take_waiting_saves).
            self._mark_save(seq, reuse)
        out = [Admission(seq, slot_id, reuse, fork)]
        for sample in seq.members[1:]:
            # Its KV will be a fork of sample 0's prompt: the least recently used slot loses least.
            slot = min((s for s in open_slots if s in idle), key=lambda s: (s.last_used, s.slot_id))
            idle.remove(slot)
            fresh.add(slot.slot_id)
            slot.seq = sample
            self.trim(slot.slot_id, 0)
            out.append(Admission(sample, slot.slot_id, 0))
        return out

    # -- reserved slots ----------------------------------------------------------------------

    def _open_to(self, seq: Sequence, idle: list[Slot]) -> list[Slot]:
        """The idle slots `seq` may take. The reserved ones are the last slot ids: requests at the
        default priority or below never take them, and an urgent one takes them first, so the
        batch's requests keep to one run of consecutive ids. llama.cpp decodes a batch of one KV
        stream per sequence in one graph run only over consecutive sequence ids: a free slot in
        their middle splits every tick in two (86 ms instead of 48 for 8 rows of the bundled
        model on 2 cores)."""
        if not self.reserved:
            return idle
        first_kept = len(self.slots) - self.reserved
        regular = [s for s in idle if s.slot_id < first_kept]
        if seq.params.priority >= 0:
            return regular
        return [s for s in idle if s.slot_id >= first_kept] or regular

    def _urgent_first(self) -> None:
        """Only reserved slots are free, which the head may not take; it is at the head out of
        priority order only when the fair share put it there. Then an urgent request behind it,
        if any, goes first (it does not take the head's turn: the head gets the next slot open
        to it)."""
        urgent = next((s for s in self.waiting if s.params.priority < 0), None)
        if urgent is not None:
            self.waiting.remove(urgent)
            self.waiting.appendleft(urgent)

    # -- preemption -------------------------------------------------------------------------

    def _preempt_for(self, head: Sequence, idle: list[Slot]) -> bool:
        """Too few slots are free for `head` (n of them for an n-request): when running requests
        of lower priority hold enough, park them, lowest priority first (the latest to arrive
        among equals), every sample of an n-request together, and give their slots to `idle`.
        Only a request in a plain state is taken: none of its slots' KV changed by anything
        decided and not yet applied, no token of it being sampled apart, not admitted by the
        fair share. Parks nothing when the victims could not free enough."""
        if self.park is None:
            return False
        need = slots_wanted(head) - len(self._open_to(head, idle))
        victims = sorted(self._preemptible(head), key=priority_key, reverse=True)
        chosen, freed = [], 0
        for victim in victims:
            if freed >= need:
                break
            chosen.append(victim)
            freed += len(running_samples(victim))
        if freed < need or not chosen:
            return False
        for victim in chosen:
            self._park(victim, idle)
        return True

    def _preemptible(self, head: Sequence) -> list[Sequence]:
        """Running requests of lower priority than `head` that may be parked now, by their first
        sample (the one queued: a request whose first sample has ended is not parked)."""
        changing = ({t.slot for t in self._trims} | set(self._restoring)
                    | {f.src_slot for f in self._forks} | {f.dst_slot for f in self._forks})
        plain = (Status.PREFILLING, Status.GENERATING, Status.FORKING)
        out = []
        for slot in self.slots:
            seq = slot.seq
            if seq is None or seq.index != 0 or seq.protected or seq.params.priority <= head.params.priority:
                continue
            members = running_samples(seq)
            if all(m.slot is not None and m.slot not in changing and m.status in plain and not m.sampling_apart
                   and self.slots[m.slot].seq is m for m in members):
                out.append(seq)
        return out

    def _park(self, seq: Sequence, idle: list[Slot]) -> None:
        """Put a request aside, every sample of it: each slot's KV as bytes (a copy, taken now,
        before any plan changes the slot; none for a sample still waiting for the prompt's fork),
        back in the queue in its place by priority and arrival, its slots to `idle`."""
        now = time.perf_counter()
        for member in running_samples(seq):
            slot = self.slots[member.slot]  # type: ignore[index]
            payload = None
            if member.status != Status.FORKING:
                try:
                    payload = self.park(slot.slot_id)  # type: ignore[misc]
                except Exception:  # no memory for the copy: it is evaluated again when it resumes
                    payload = None
            if payload is not None and self.parked_bytes + len(payload) > self.park_budget:
                payload = None  # past the budget: dropped, evaluated again when it resumes
            self.parked_bytes += len(payload) if payload is not None else 0
            member.parked = Parked(payload, member.num_computed, list(slot.cached), member.status)
            member.preemptions += 1
            member.paused_at = now
            member.save_at = None  # a prefix save planned for it is dropped (an optimisation only)
            member.slot = None
            member.status = Status.WAITING
            slot.seq = None
            slot.last_used = now
            idle.append(slot)
        self.preempted.append(seq)
        self._enqueue(seq)

    def _resume(self, seq: Sequence, idle: list[Slot], fresh: set[int], open_slots: list[Slot]) -> list[Admission]:
        """A parked request takes the least recently used idle slots open to it, one a sample;
        the next plan puts each sample's KV back there (a Restore), or, without its bytes, that
        sample is evaluated again from the start (a sample that was waiting for the prompt's
        fork waits for it again)."""
        out = []
        for member in (m for m in seq.members if m.parked is not None):
            slot = min((s for s in open_slots if s in idle), key=lambda s: (s.last_used, s.slot_id))
            idle.remove(slot)
            fresh.add(slot.slot_id)
            slot.seq = member
            self.trim(slot.slot_id, 0)
            parked = member.parked
            if parked.payload is not None:
                self._restores.append(Restore(slot.slot_id, parked.n_cells, parked.payload, resume=True))
                self._restoring[slot.slot_id] = parked.cached
                self._resuming.add(slot.slot_id)
            out.append(Admission(member, slot.slot_id, 0))
        return out

    def _unpark_bytes(self, parked: Parked | None) -> None:
        if parked is not None and parked.payload is not None:
            self.parked_bytes -= len(parked.payload)

    def take_preempted(self) -> list[Sequence]:
        """The requests parked since the last call (the engine counts them as waiting again)."""
        out, self.preempted = self.preempted, []
        return out

    def _resumed(self, seq: Sequence, slot: Slot, ok: bool) -> None:
        """What a parked request's Restore gave: its KV where it stopped, or (refused, or no
        bytes to restore) nothing, and it evaluates its prompt and answer so far again."""
        parked, seq.parked = seq.parked, None
        self._unpark_bytes(parked)
        if ok:
            slot.cached = list(parked.cached)
            slot.floor = self._restored_floor(parked.n_cells)
            seq.num_computed = parked.n_cells
            seq.status = parked.status
        elif parked.status == Status.FORKING:
            slot.cached, slot.floor = [], 0
            seq.num_computed = 0
            seq.status = Status.FORKING  # it waits for the prompt's fork again, as when first admitted
        else:
            slot.cached, slot.floor = [], 0
            seq.num_computed = 0
            seq.status = Status.PREFILLING  # the answer so far is evaluated as prompt; then it samples on
        if seq.paused_at is not None:
            seq.paused_ms += (time.perf_counter() - seq.paused_at) * 1000
            seq.paused_at = None

    def _restored_floor(self, n_cells: int) -> int:
        """The shortest prefix a slot restored with `n_cells` tokens may be cut back to: any (0)
        when the restore brought every position back, else only its restored end. A line put
        aside for an online request thus leaves its slot's prompt prefix to the next line as an
        evaluated slot does (on online_beside_batch.py's lines, about 6 prompt tokens a preemption
        that were evaluated again before)."""
        whole = self.restored_whole_below
        return 0 if whole is not None and n_cells < whole else n_cells

    # -- room in a shared KV pool ------------------------------------------------------------

    def reserved_for(self, seq: Sequence) -> int:
        """The cells a request (all its samples) may come to hold in a pool: its prompt and
        max_tokens, at most slot_ctx each. Guesses stay within it (speculation._room)."""
        if self.pool_cells is None:
            return 0
        return sum(min(self.slot_ctx, len(m.prompt) + m.params.max_tokens) for m in seq.members)

    def _room_left(self) -> int:
        """Cells of the pool neither reserved by a running request nor kept by an idle slot's
        cache (shared cells of forks count once per slot: never less room than there is)."""
        if self.pool_cells is None:
            return 1 << 62
        held = 0
        for slot in self.slots:
            held += self.reserved_for(slot.seq) if slot.seq is not None else len(slot.cached)
        return self.pool_cells - held

    def _make_room(self, seq: Sequence, idle: list[Slot]) -> bool:
        """Whether `seq` fits the pool now, emptying idle slots' caches (least recently used
        first) when it fits only without them. Always True with a stream per slot."""
        if self.pool_cells is None:
            return True
        need, left = self.reserved_for(seq), self._room_left()
        if need <= left:
            return True
        spare = sum(len(s.cached) for s in idle)
        if need > left + spare:
            return False
        for slot in sorted(idle, key=lambda s: (s.last_used, s.slot_id)):
            if need <= left:
                break
            if slot.cached:
                left += len(slot.cached)
                self.trim(slot.slot_id, 0)
        return True

    # -- the disk prefix store -------------------------------------------------------------

    def _mark_save(self, seq: Sequence, n: int) -> None:
        """`seq`'s first `n` prompt tokens are shared with another request: if the store lacks
        them and seq's prefill has not passed them yet, save its slot when exactly they are in
        it (schedule cuts the chunk there). A restored entry continues only from its end (plan.
        Restore), so the entry must be the shared part itself, not a slot that went further."""
        if self.disk is None or n < self.disk.save_min or seq.status not in (Status.WAITING, Status.PREFILLING):
            return
        if seq.num_computed >= n or (seq.save_at is not None and seq.save_at <= n):
            return  # passed already, or a save of a shorter (more widely shared) prefix is planned
        if self.disk.has(seq.prompt[:n]):
            return
        seq.save_at = n

    def _mark_queued_saves(self) -> None:
        """Requests still queued (every slot busy) that share a prefix with a running prompt:
        mark the running one to save it, as admission does for a request it holds back."""
        prefilling = [s for s in self.slots if s.seq is not None and s.seq.status == Status.PREFILLING]
        if not prefilling:
            return
        for seq in list(self.waiting)[: len(self.slots)]:
            maker, coming = longest_shared(seq.prompt, [(s.slot_id, s.seq.prompt) for s in prefilling])  # type: ignore[union-attr]
            if maker is not None:
                self._mark_save(self.slots[maker].seq, coming)  # type: ignore[arg-type]

    def _take_waiting_saves(self, plan: StepPlan) -> None:
        """Requests that sat this tick out so their slot, trimmed or forked to exactly a prefix
        worth keeping by this plan, is saved now. A trim is done when the plan has run; a fork's
        copy (a KV stream per slot) only inside a llama_decode, so after a plan that decoded
        nothing a forked copy is not saved (the request goes on regardless)."""
        trimmed = {t.slot for t in plan.trims}
        forked = {f.dst_slot for f in plan.forks}
        for slot in self.slots:
            seq = slot.seq
            if seq is None or seq.status != Status.PREFILLING or seq.save_at != seq.num_computed:
                continue
            if (slot.slot_id in forked and plan.chunks) or (slot.slot_id in trimmed and slot.slot_id not in forked):
                self._saves.append(SaveWanted(seq, slot.slot_id, list(slot.cached)))
            seq.save_at = None

    def take_saves(self) -> list[SaveWanted]:
        """The slots to snapshot now (each holds exactly its SaveWanted.tokens)."""
        saves, self._saves = self._saves, []
        return saves

    def _take_restore(self, slot_id: int, ok: bool) -> None:
        """What a planned Restore gave: the slot holds the entry's tokens, or nothing."""
        tokens = self._restoring.pop(slot_id, [])
        slot = self.slots[slot_id]
        if slot_id in self._resuming:
            self._resuming.discard(slot_id)
            if slot.seq is not None and slot.seq.parked is not None and slot.seq.status == Status.RESTORING:
                self._resumed(slot.seq, slot, ok)
            else:  # ended meanwhile: its cells are no prefix anyone asked for
                slot.cached, slot.floor = [], 0
                self.trim(slot_id, 0)
            return
        slot.cached = tokens if ok else []
        slot.floor = self._restored_floor(len(slot.cached))
        seq = slot.seq
        if seq is None or seq.status != Status.RESTORING:
            return  # ended meanwhile: the slot keeps what it holds for a later request
        seq.num_computed = seq.num_cached = seq.num_restored = len(slot.cached)
        seq.status = Status.PREFILLING

    def fork(self, src_slot: int, dst_slot: int, n_tokens: int) -> Fork:
        """Decide a KV fork (see plan.Fork): `dst_slot` will hold `src_slot`'s first
        `n_tokens` tokens. The bookkeeping changes now; the fork rides on the next plan,
        where the runner applies it before that tick's decode. A slot's chunk in that plan
        starts after what the fork gave it. For `n` samples: once the first sample's slot
        holds the prompt, fork it into each sibling's slot (n_tokens = len(prompt) - 1, so
        every sibling evaluates the last prompt token itself and samples its own first token)."""
        src, dst = self.slots[src_slot], self.slots[dst_slot]
        if src is dst or not 0 < n_tokens <= len(src.cached):
            raise ValueError(f"cannot fork {n_tokens} tokens of slot {src_slot} (holds {len(src.cached)}) "
                             f"into slot {dst_slot}")
        if any(f.dst_slot in (src_slot, dst_slot) or f.src_slot == dst_slot for f in self._forks):
            raise ValueError(f"slot {dst_slot} or {src_slot} is already the target of a fork in this tick")
        if n_tokens < src.floor:
            raise ValueError(f"cannot fork {n_tokens} tokens of slot {src_slot}: restored, it keeps at least {src.floor}")
        fork = Fork(src_slot, dst_slot, n_tokens)
        dst.cached = src.cached[:n_tokens]
        dst.floor = src.floor
        self._forks.append(fork)
        return fork

    def trim(self, slot_id: int, n_keep: int) -> Trim:
        """Decide a KV trim (see plan.Trim): the slot will hold only its first `n_keep` tokens.
        The bookkeeping changes now; the trim rides on the next plan, where the runner applies
        it first, before that plan's forks and its decode."""
        slot = self.slots[slot_id]
        if not 0 <= n_keep <= len(slot.cached):
            raise ValueError(f"cannot keep {n_keep} tokens of slot {slot_id} (holds {len(slot.cached)})")
        if 0 < n_keep < slot.floor:
            raise ValueError(f"cannot keep {n_keep} tokens of slot {slot_id}: restored, it keeps at least {slot.floor}")
        trim = Trim(slot_id, n_keep)
        slot.cached = slot.cached[:n_keep]
        if n_keep == 0:
            slot.floor = 0
        self._trims.append(trim)
        return trim

    def start(self, seq: Sequence, slot_id: int, kept: int) -> None:
        """The slot's KV now holds exactly `kept` tokens of seq's prompt prefix (or, when admission
        planned a Restore for it, what that Restore gives; its first chunk comes after that)."""
        restoring = slot_id in self._restoring
        slot = self.slots[slot_id]
        if seq.parked is not None:  # resumed: its own state stays; its KV comes back by the Restore
            slot.seq, seq.slot = seq, slot_id
            seq.status = Status.RESTORING
            if not restoring:
                self._resumed(seq, slot, False)
            return
        slot.cached = slot.cached[:kept]
        slot.seq = seq
        seq.slot = slot_id
        seq.num_computed = seq.num_cached = kept
        # samples 1..n-1 of an n-request wait for sample 0's prompt instead of evaluating it
        seq.status = Status.FORKING if seq.index else Status.RESTORING if restoring else Status.PREFILLING
        if seq.params.store_prefix and self.disk is not None and seq.index == 0:
            seq.save_at = len(seq.prompt)  # the slot holds exactly the prompt after its last chunk
        if self.speculation is not None and self.speculation.drafts_for(seq):
            seq.drafter = Drafter(seq.prompt, seq.prediction)
        seq.admitted_at = time.perf_counter()
        seq.admit_order = self._admitted
        self._admitted += 1
        self._detok[seq] = IncrementalDetokenizer(seq.params.stop)

    # -- one tick --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        running = [s for s in self.running if not s.sampling_apart]  # those wait for their token
        decodes = [s for s in running if s.status == Status.GENERATING]
        # A request whose slot this plan trims or forks to exactly a prefix to save sits the tick
        # out (save_at == num_computed): _take_waiting_saves saves the slot after the plan has run.
        changing = {t.slot for t in self._trims} | {f.dst_slot for f in self._forks}
        prefills = []
        for seq in running:
            if seq.status != Status.PREFILLING:
                continue
            if seq.save_at is not None and seq.save_at == seq.num_computed:
                if seq.slot in changing:
                    continue
                seq.save_at = None  # nothing in this plan makes the slot hold exactly it: not saved
            prefills.append(seq)
        # higher priority first: its prompt takes the tick's prefill budget before lower ones'
        prefills.sort(key=lambda s: (s.params.priority, s.admit_order))
        decodes, prefills = self._urgent_only(decodes, prefills)
        allocation = self.policy(decodes, prefills, self.n_batch, self.chunk_size, lambda s: s.num_pending)
        chunks = []
        for seq, n in allocation:
            if seq.save_at is not None and seq.num_computed < seq.save_at < seq.num_computed + n:
                n = seq.save_at - seq.num_computed  # end the chunk where the prefix to save ends
            tokens = seq.pending_tokens(n)
            wants_logits = seq.num_computed + n == seq.num_tokens
            siblings = [(s.slot, s.sampler) for s in seq.members[1:] if s.status == Status.FORKING] \
                if wants_logits and seq.group is not None and seq.status == Status.PREFILLING else []
            chunks.append(Chunk(slot=seq.slot, request_id=seq.request_id, tokens=tokens,
                                start_pos=seq.num_computed, wants_logits=wants_logits,
                                is_decode=seq.status == Status.GENERATING,
                                suppress_eog=len(seq.output) < seq.params.min_tokens,
                                sampler=seq.sampler if wants_logits else None,
                                logprobs=seq.params.logprobs if wants_logits else None, siblings=siblings,
                                sample_apart=wants_logits and self.sample_apart is not None
                                and self.sample_apart(seq)))
        # In slot order: with a KV stream per slot, llama.cpp puts rows of consecutive slot ids
        # in one ubatch (llama/ubatch_split.py); in admission order a mixed tick made ~1 more
        # graph run per out-of-order slot. The unified cache does not care.
        chunks.sort(key=lambda c: c.slot)
        spare = self.n_batch - sum(len(c.tokens) for c in chunks)
        if self.speculation is not None and spare > 0:
            self.speculation.add_guesses(chunks, lambda slot: self.slots[slot].seq, spare,  # type: ignore[arg-type,return-value]
                                         self.chunk_size, self.slot_ctx)
        forks, self._forks = self._forks, []
        trims, self._trims = self._trims, []
        restores, self._restores = self._restores, []
        return StepPlan(chunks, forks, trims, restores)

    @staticmethod
    def _urgent_only(decodes: list[Sequence], prefills: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
        """A tick that evaluates a prompt of higher priority than some running request's carries
        no rows of lower priority than that prompt: its first token comes after a tick as short
        as on an idle engine (measured: a 26-token chat prompt beside 7 decode rows took 110 ms
        in 2 graph runs, alone 60 ms), and the lower rows wait that one tick. With one KV cache
        (kv_unified) the mixed tick is one graph run, but 8 decode rows still take longer than a
        short prompt: letting them ride in it (tried, 60 lines of 16 tokens beside a chat each
        second) put the chats' first token at 2.4x idle, median, against 1.1x, and the batch
        gained nothing measurable (0.953 against 0.960 of its speed alone). A request the fair
        share admitted keeps its rows: a steady stream of higher prompts never stalls it."""
        if not prefills:
            return decodes, prefills
        top = prefills[0].params.priority  # prefills are sorted by priority
        if all(s.params.priority <= top for s in decodes) and prefills[-1].params.priority <= top:
            return decodes, prefills
        return ([s for s in decodes if s.params.priority <= top or s.protected],
                [s for s in prefills if s.params.priority <= top or s.protected])

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
            self._take_restore(slot_id, ok)
        for slot_id in result.emptied:
            self._emptied(slot_id)
        for chunk in plan.chunks:
            slot = self.slots[chunk.slot]
            seq = slot.seq
            if seq is None or seq.request_id != chunk.request_id:
                continue  # finished (cancelled) while the tick ran
            evaluated = len(chunk.tokens) - chunk.n_draft  # the guesses' cells are kept as verified
            seq.num_computed += evaluated
            if self.cache_generated or not chunk.is_decode:
                slot.cached.extend(chunk.tokens[:evaluated])
            if chunk.n_draft:
                self._keep_verified(chunk, seq, result.accepted.get(chunk.slot, 0) if chunk.slot in result.sampled else 0)
            if seq.save_at is not None and seq.num_computed == seq.save_at and not chunk.is_decode:
                self._saves.append(SaveWanted(seq, chunk.slot, list(slot.cached)))
                seq.save_at = None
            if chunk.wants_logits and chunk.slot in result.apart:
                seq.sampling_apart = True  # no chunk for it until its token lands (accept_apart)
                continue
            events += self._take_row(chunk, seq, result.sampled, result.logprobs, result.forced,
                                     result.accepted, result.accepted_logprobs)
        self._take_waiting_saves(plan)
        return events

    def _emptied(self, slot_id: int) -> None:
        """The runner emptied a slot it could not trim or fork as planned (StepResult.emptied):
        its request evaluates its prompt and answer so far again, then samples on."""
        slot = self.slots[slot_id]
        slot.cached, slot.floor = [], 0
        seq = slot.seq
        if seq is None or seq.status not in (Status.PREFILLING, Status.GENERATING):
            return
        seq.num_computed = seq.num_cached = seq.num_restored = 0
        seq.status = Status.PREFILLING
        seq.save_at = None  # a planned save of a prefix it was to reuse: an optimisation only

    def _keep_verified(self, chunk: Chunk, seq: Sequence, kept: int) -> None:
        """A verified chunk: its first `kept` guesses' cells stay (the tokens join the output
        in _take_row), the other guesses' cells go by a Trim in the next plan."""
        evaluated = len(chunk.tokens) - chunk.n_draft
        seq.num_computed += kept
        slot = self.slots[chunk.slot]
        if self.cache_generated:
            slot.cached.extend(chunk.tokens[evaluated:evaluated + kept])
        if kept < chunk.n_draft:
            self._trims.append(Trim(chunk.slot, chunk.start_pos + evaluated + kept))
            if self.cache_generated:
                del slot.cached[chunk.start_pos + evaluated + kept:]
        seq.rejected_drafts += chunk.n_draft - kept
        if seq.drafter is not None:
            seq.drafter.observe(chunk.n_draft, kept)

    def accept_apart(self, chunk: Chunk, sampled: dict[int, int], logprobs: dict[int, dict]) -> list[SeqEvent]:
        """Take the tokens a SampleJob sampled for `chunk`'s row (and its siblings), as `update`
        takes inline ones. The caller checks the request has not ended meanwhile."""
        seq = self.slots[chunk.slot].seq
        if seq is None or seq.request_id != chunk.request_id:
            return []
        seq.sampling_apart = False
        return self._take_row(chunk, seq, sampled, logprobs, {})  # masked grammars (forced tokens) sample inline

    @staticmethod
    def _kept_guesses(chunk: Chunk, accepted: dict[int, int],
                      accepted_logprobs: dict[int, list[dict]]) -> list[tuple[int, dict | None]]:
        """The guesses of `chunk` its verification kept, with their logprob records."""
        kept = accepted.get(chunk.slot, 0) if chunk.n_draft else 0
        if not kept:
            return []
        first = len(chunk.tokens) - chunk.n_draft
        records = accepted_logprobs.get(chunk.slot) or [None] * kept
        return list(zip(chunk.tokens[first:first + kept], records))

    def _take_row(self, chunk: Chunk, seq: Sequence, sampled: dict[int, int],
                  logprobs: dict[int, dict], forced: dict[int, list[int]], accepted: dict[int, int] | None = None,
                  accepted_logprobs: dict[int, list[dict]] | None = None) -> list[SeqEvent]:
        events = []
        if chunk.wants_logits and chunk.slot in sampled:
            guesses = self._kept_guesses(chunk, accepted or {}, accepted_logprobs or {})
            events.append(self._accept(seq, sampled[chunk.slot], logprobs.get(chunk.slot), forced.get(chunk.slot),
                                       guesses))
        for slot_id, _ in chunk.siblings:
            sample = self.slots[slot_id].seq
            if sample is None or sample.status != Status.FORKING or slot_id not in sampled:
                continue
            # Its prompt KV is sample 0's, copied by a fork before the next decode.
            self.fork(chunk.slot, slot_id, len(sample.prompt))
            sample.num_computed = sample.num_cached = len(sample.prompt)
            events.append(self._accept(sample, sampled[slot_id], logprobs.get(slot_id), forced.get(slot_id)))
        return events

    def _accept(self, seq: Sequence, token: int, logprob: dict | None, forced: list[int] | None = None,
                guesses: list[tuple[int, dict | None]] = ()) -> SeqEvent:  # type: ignore[assignment]
        """Take the guesses its verification kept, then a sampled token, then any its grammar
        forced after it: each joins the output (stops, max_tokens and the slot's end checked
        after every one), and the forced ones wait in the output for the next tick's chunk to
        evaluate them (num_pending > 1)."""
        event = SeqEvent(seq)
        steps = [*((tok, lp, "guess") for tok, lp in guesses), (token, logprob, "sampled"),
                 *((tok, None, "forced") for tok in forced or ())]
        for tok, lp, kind in steps:
            if event.finished:
                break
            more = self._accept_one(seq, tok, lp)
            event.tokens += more.tokens
            event.text += more.text
            event.finished = more.finished
            if kind == "forced":
                event.forced += 1
                seq.forced_tokens += 1
            elif kind == "guess" and more.tokens:
                event.accepted += 1
                seq.accepted_drafts += 1
        return event

    def _accept_one(self, seq: Sequence, token: int, logprob: dict | None) -> SeqEvent:
        now = time.perf_counter()
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.status = Status.GENERATING  # also a resumed request that evaluated its answer again
        detok = self._detok[seq]
        event = SeqEvent(seq)
        if self.is_eog(token):
            # The end-of-generation token is not part of the answer. ignore_eos is enforced
            # by the runner's sampler (EOG banned); an EOG that still comes out means the
            # request's grammar allows nothing else, so the request is done.
            event.text = detok.finish()
            self.finish(seq, "stop")
            event.finished = True
            return event
        seq.output.append(token)
        event.tokens.append(token)
        if seq.drafter is not None:
            seq.drafter.extend((token,))
        if logprob is not None and seq.logprobs is not None:
            seq.logprobs.append(logprob)
        event.text = detok.push(self.token_bytes(token))
        if detok.stopped:
            seq.stop_hit = detok.stop_hit
            self.finish(seq, "stop")
        elif len(seq.output) >= seq.params.max_tokens or seq.num_tokens >= self.slot_ctx:
            event.text += detok.finish()
            self.finish(seq, "length")
        event.finished = seq.finished
        return event

    # -- endings -------------------------------------------------------------------------

    def finish(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> str:
        """Give seq its terminal status and free its slot. Returns any held-back text."""
        tail = ""
        detok = self._detok.pop(seq, None)
        if detok is not None and not detok.stopped and reason in ("cancelled", "timeout"):
            tail = detok.finish()
        if detok is not None:
            seq.text = detok.text
        seq.status = Status.FINISHED
        seq.queued = False
        if seq.parked is not None:  # ended while put aside: its copy goes
            self._unpark_bytes(seq.parked)
            seq.parked = None
        seq.finished_at = time.perf_counter()
        if seq.paused_at is not None:  # ended while put aside (or before its restore ran): that pause counts
            seq.paused_ms += (seq.finished_at - seq.paused_at) * 1000
            seq.paused_at = None
        seq.drafter = None  # its index of the prompt and answer is not needed any more
        seq.finish_reason = reason
        seq.error, seq.error_code = error, code
        if seq.slot is not None:
            slot = self.slots[seq.slot]
            if slot.seq is seq:
                slot.seq = None
                slot.last_used = seq.finished_at
        elif seq in self.waiting:
            self.waiting.remove(seq)
        return tail

    def forget_slot(self, slot_id: int) -> None:
        """After a failed decode the slot's KV is not known: empty it, by a Trim that the next
        plan carries (the failed plan has run; until then the slot is idle and, not being
        busy, never a fork source, so nothing reads the stale cells)."""
        self.trim(slot_id, 0)
