"""Admission: the waiting queue and who gets which idle slot, reusing or forking what KV.

Requests wait in priority order, then arrival, with a fair share so the oldest is never
starved; the last slots may be reserved for urgent requests; a running request of lower
priority may be parked (its KV kept as bytes) to make room for a higher one, and resumes
later where it stopped. Each admission's KV change (a trim, a fork, a restore) is decided in
the KV ledger and rides on the next plan. Never imports llama_cpp.
"""
from __future__ import annotations

import bisect
import heapq
import time
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from .kv_ledger import KVLedger, Slot
from ..plan import Fork, Restore
from ..prefixes.prefix import SlotView, choose_slot, longest_shared
from .prefix_saves import PrefixSaves
from ..sequence import Sequence, Status

if TYPE_CHECKING:
    from ..prefixes.disk_prefix import DiskPrefixes

# Priority's guard against starvation: once the oldest waiting request has watched this many
# admissions of others go ahead of it, it is admitted next whatever its priority, and it is
# never preempted (a steady stream of higher-priority requests still leaves it every 9th slot).
FAIR_SHARE = 8


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


def running_samples(seq: Sequence) -> list[Sequence]:
    """The samples of seq's request that have not ended (an n-request's end one by one)."""
    return [m for m in seq.members if not m.finished]


def slots_wanted(seq: Sequence) -> int:
    """The slots a queued request takes at once: one a sample; for one put aside, one for each
    sample it put aside (its samples that had ended stay ended)."""
    if seq.kv.parked is None:
        return len(seq.members)
    return sum(1 for m in seq.members if m.kv.parked is not None)


def priority_key(seq: Sequence) -> tuple[int, int]:
    """Who goes first: lower priority value, then arrival (request ids are given in order)."""
    return (seq.params.priority, seq.request_id)


def urgent_rows_only(decodes: list[Sequence], prefills: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """A tick that evaluates a prompt of higher priority than some running request's carries
    no rows of lower priority than that prompt, so its first token comes as soon as on an idle
    engine; the lower rows wait that one tick (docs/performance.md, "Scheduler notes"). A request
    the fair share admitted keeps its rows: a steady stream of higher prompts never stalls it."""
    if not prefills:
        return decodes, prefills
    top = prefills[0].params.priority  # prefills are sorted by priority
    if all(s.params.priority <= top for s in decodes) and prefills[-1].params.priority <= top:
        return decodes, prefills
    return ([s for s in decodes if s.params.priority <= top or s.queue.protected],
            [s for s in prefills if s.params.priority <= top or s.queue.protected])


def least_recently_used(open_slots: list[Slot], idle: list[Slot]) -> Slot:
    """The idle slot open to a request whose cache loses least: the one used longest ago."""
    return min((s for s in open_slots if s in idle), key=lambda s: (s.last_used, s.slot_id))


class AdmissionQueue:
    def __init__(self, ledger: KVLedger, saves: PrefixSaves, cache_prompt: bool, fork_min_tokens: int = 0,
                 reserved: int = 0, disk: "DiskPrefixes | None" = None):
        self.ledger = ledger
        self.slots = ledger.slots
        self.saves = saves
        self.cache_prompt = cache_prompt
        # Prefix sharing across slots: a prompt sharing at least this many tokens with what
        # another slot holds (or is evaluating) gets them by a KV fork. 0 = off.
        self.fork_min_tokens = fork_min_tokens
        # Slots only a request above the default priority may take (EngineConfig.reserved_slots):
        # an urgent arrival beside a full batch takes one instead of parking a batch request.
        self.reserved = reserved
        self.disk = disk  # the disk prefix store: a request no slot can give more is restored from it
        self.waiting: deque[Sequence] = deque()
        self.preempted: list[Sequence] = []  # parked since the engine last took them (take_preempted)
        self._arrivals: list[tuple[int, int, Sequence]] = []  # heap by request id: the oldest waiting request
        self._pushed = 0
        self._passed = 0  # admissions that went ahead of the oldest waiting request (FAIR_SHARE)
        self._oldest: Sequence | None = None

    # -- the queue ----------------------------------------------------------------------------

    def enqueue(self, seq: Sequence) -> None:
        """Into the queue by (priority, arrival): after every request that goes before it."""
        key = priority_key(seq)
        if not self.waiting or priority_key(self.waiting[-1]) <= key:
            self.waiting.append(seq)  # the common case (one priority): the end
        else:
            self.waiting.insert(bisect.bisect_right(self.waiting, key, key=priority_key), seq)
        # the count breaks ties between entries of equal request ids (Sequences do not compare)
        self._pushed += 1
        heapq.heappush(self._arrivals, (seq.request_id, self._pushed, seq))
        seq.queue.queued = True

    def oldest_waiting(self) -> Sequence | None:
        while self._arrivals and not (self._arrivals[0][2].queue.queued
                                      and self._arrivals[0][2].status == Status.WAITING):
            heapq.heappop(self._arrivals)  # admitted or ended since (a parked one is pushed again)
        return self._arrivals[0][2] if self._arrivals else None

    def _fair_share(self) -> None:
        """Put the oldest waiting request at the head when FAIR_SHARE admissions went ahead of it."""
        oldest = self.oldest_waiting()
        if oldest is not self._oldest:
            self._oldest, self._passed = oldest, 0
        if oldest is None or self._passed < FAIR_SHARE or self.waiting[0] is oldest:
            return
        if oldest not in self.waiting:
            return  # held back in this admission (it waits for a prefix another slot evaluates)
        self.waiting.remove(oldest)
        self.waiting.appendleft(oldest)
        oldest.queue.protected = True

    def _admitted_one(self, seq: Sequence) -> None:
        seq.queue.queued = False
        if seq is self._oldest:
            self._oldest, self._passed = None, 0
        else:
            self._passed += 1

    # -- admission ----------------------------------------------------------------------------

    def admit(self) -> list[Admission]:
        """Give idle slots to waiting requests, in priority order, then arrival; the caller then
        calls Scheduler.start for each Admission. A request that shares a prefix with what
        another slot holds gets it by a fork (_place); one whose prefix another slot is still
        evaluating is held back until it is there, while requests behind it may go first."""
        out: list[Admission] = []
        if self.waiting:
            self.ledger.refresh_min_keep()
        pinned = self.ledger.fork_ends()
        idle = [s for s in self.slots if s.seq is None and s.slot_id not in pinned]
        held_back: list[Sequence] = []
        handed_out: set[int] = set()  # slots given in this call: not yet trimmed, so no fork source
        while self.waiting:
            open_slots = self._slots_for_head(idle)
            if open_slots is None:
                break  # in order: what is behind the head goes no sooner
            seq = self.waiting.popleft()
            if seq.kv.parked is not None:
                self._admitted_one(seq)
                out.extend(self._resume(seq, idle, handed_out, open_slots))
                continue
            place = self._place(seq, open_slots, handed_out)
            if place is None:
                held_back.append(seq)
                continue
            self._admitted_one(seq)
            out.extend(self._hand_out(seq, *place, idle, handed_out, open_slots))
        self.waiting.extendleft(reversed(held_back))
        if self.disk is not None and self.waiting:
            self.saves.mark_queued(self.waiting)
        return out

    def _slots_for_head(self, idle: list[Slot]) -> list[Slot] | None:
        """The idle slots the head of the queue (after the fair share) takes, preempting lower
        requests when too few are free; None when it cannot be admitted yet."""
        self._fair_share()
        if idle and not self._open_to(self.waiting[0], idle):
            self._urgent_first()  # only reserved slots are free: an urgent request behind the head takes one
        head = self.waiting[0]
        open_slots = self._open_to(head, idle)
        if slots_wanted(head) > len(open_slots):
            # an n-request takes n slots at once; in order, so nothing overtakes it meanwhile
            if not self._preempt_for(head, idle):
                return None
            open_slots = self._open_to(head, idle)
            if slots_wanted(head) > len(open_slots):
                return None
        if not self.ledger.make_room(head, idle):
            return None  # a pool without room for it yet: it waits for running requests to end
        return open_slots

    def _place(self, seq: Sequence, open_slots: list[Slot],
               handed_out: set[int]) -> tuple[int, int, Fork | None] | None:
        """Where seq goes: the open slot whose cache it reuses most, and a fork of a busy slot's
        prefix when that saves `fork_min_tokens` more; None (held back) when a slot is still
        evaluating a longer shared prefix, which it then forks instead of evaluating again."""
        views = [SlotView(s.slot_id, s.cached, s.last_used) for s in open_slots]
        slot_id, reuse = choose_slot(seq.prompt, views, cache_prompt=self.cache_prompt)
        if reuse < self.slots[slot_id].min_keep:
            reuse = 0  # it cannot be cut back that far: emptied and evaluated
        if not self.fork_min_tokens:
            return slot_id, reuse, None
        busy = [s for s in self.slots if s.seq is not None]
        src, n = longest_shared(seq.prompt, [(s.slot_id, s.cached) for s in busy if s.slot_id not in handed_out])
        if src is not None and n < self.slots[src].min_keep:
            src, n = None, 0  # its copy could not be cut back to n
        evaluator, coming = longest_shared(seq.prompt, [(s.slot_id, s.seq.prompt) for s in busy])  # type: ignore[union-attr]
        if coming > n and coming - reuse >= self.fork_min_tokens:
            self.saves.mark(self.slots[evaluator].seq, coming)  # type: ignore[arg-type,index]
            return None
        if src is not None and n - reuse >= self.fork_min_tokens:
            return slot_id, n, self.ledger.fork(src, slot_id, n)
        return slot_id, reuse, None

    def _hand_out(self, seq: Sequence, slot_id: int, reuse: int, fork: Fork | None, idle: list[Slot],
                  handed_out: set[int], open_slots: list[Slot]) -> list[Admission]:
        """Hand `slot_id` to an admitted request (and the least recently used idle slots open to
        it to an n-request's other samples): the slot's KV change (a restore from the disk
        store, a trim to what it reuses, or the fork) rides on the next plan."""
        hit = self.disk.lookup(seq.prompt, longer_than=reuse) if fork is None and self.disk is not None else None
        slot = self.slots[slot_id]
        idle.remove(slot)
        handed_out.add(slot_id)
        slot.seq = seq  # reserved now so the same slot is not handed out twice
        if hit is not None:
            slot.cached = []  # what the restore brings is known only once it has run (update)
            self.ledger.plan_restore(Restore(slot_id, len(hit.tokens), hit.payload), hit.tokens)
            reuse = 0
        else:
            if fork is None:
                self.ledger.trim(slot_id, reuse)
            # A prefix worth keeping that its first slot went past: the trimmed cache or the
            # forked copy holds exactly it once this tick's plan has run. The request sits
            # that tick out and the slot is saved then (PrefixSaves.take_waiting).
            self.saves.mark(seq, reuse)
        out = [Admission(seq, slot_id, reuse, fork)]
        for sample in seq.members[1:]:
            # Its KV will be a fork of sample 0's prompt: the least recently used slot loses least.
            slot = least_recently_used(open_slots, idle)
            idle.remove(slot)
            handed_out.add(slot.slot_id)
            slot.seq = sample
            self.ledger.trim(slot.slot_id, 0)
            out.append(Admission(sample, slot.slot_id, 0))
        return out

    # -- reserved slots ----------------------------------------------------------------------

    def _open_to(self, seq: Sequence, idle: list[Slot]) -> list[Slot]:
        """The idle slots `seq` may take. The reserved ones are the last slot ids: requests at the
        default priority or below never take them, and an urgent one takes them first, so the
        batch's requests keep to one run of consecutive ids, which llama.cpp decodes in one
        graph run with a KV stream per slot (docs/performance.md, "Scheduler notes")."""
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
        Parks nothing when the victims could not free enough."""
        if self.ledger.snapshot is None:
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
        sample (the one queued: a request whose first sample has ended is not parked). Only one
        in a plain state: none of its slots' KV changed by anything decided and not yet applied,
        no token of it being sampled apart, not admitted by the fair share."""
        changing = self.ledger.changing()
        plain = (Status.PREFILLING, Status.GENERATING, Status.FORKING)
        out = []
        for slot in self.slots:
            seq = slot.seq
            if seq is None or seq.index != 0 or seq.queue.protected or seq.params.priority <= head.params.priority:
                continue
            members = running_samples(seq)
            if all(m.kv.slot is not None and m.kv.slot not in changing and m.status in plain and not m.sampling_apart
                   and self.slots[m.kv.slot].seq is m for m in members):
                out.append(seq)
        return out

    def _park(self, seq: Sequence, idle: list[Slot]) -> None:
        """Put a request aside, every sample of it (KVLedger.park), back in the queue in its
        place by priority and arrival, its slots to `idle`."""
        now = time.perf_counter()
        for member in running_samples(seq):
            idle.append(self.ledger.park(member, now))
        self.preempted.append(seq)
        self.enqueue(seq)

    def _resume(self, seq: Sequence, idle: list[Slot], handed_out: set[int],
                open_slots: list[Slot]) -> list[Admission]:
        """A parked request takes the least recently used idle slots open to it, one a sample;
        the next plan puts each sample's KV back there (a Restore), or, without its bytes, that
        sample is evaluated again from the start (a sample that was waiting for the prompt's
        fork waits for it again)."""
        out = []
        for member in (m for m in seq.members if m.kv.parked is not None):
            slot = least_recently_used(open_slots, idle)
            idle.remove(slot)
            handed_out.add(slot.slot_id)
            self.ledger.plan_resume(member, slot)
            out.append(Admission(member, slot.slot_id, 0))
        return out

    def take_preempted(self) -> list[Sequence]:
        """The requests parked since the last call (the engine counts them as waiting again)."""
        out, self.preempted = self.preempted, []
        return out
