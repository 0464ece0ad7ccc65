"""The KV ledger: what each slot's KV cache holds, and the changes to it the next plan carries.

It is the one owner of "what is in each slot" (`Slot.cached`). A trim, a fork, a restore
(from the disk prefix store, or of a parked request's own KV) or a move (a running request
into an idle slot below it: plan_moves) changes the bookkeeping when it is decided and rides
on the next StepPlan, where the runner applies it; `update`'s half
(what a restore gave, what a tick evaluated) comes back through here too. It also keeps the
room of a KV pool the slots share and the bytes of parked requests' KV. Never imports llama_cpp.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..plan import Chunk, Fork, Move, Restore, StepResult, Trim
from ..sequence import Sequence, Status


@dataclass(eq=False)
class Slot:
    slot_id: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV sits in this slot, by position
    last_used: float = 0.0
    # The shortest prefix of its tokens the slot can be cut back to (0: any). Two things raise
    # it: a restore (llama.cpp restores just the last n_swa positions of Gemma 3's window
    # layers, plan.Restore), and neighbours in a shared cache taking its early window cells
    # (Runner.keep_floor).
    min_keep: int = 0
    seq: Sequence | None = None

    @property
    def state(self) -> str:
        if self.seq is None:
            return "idle"
        return "generating" if self.seq.status == Status.GENERATING else "prefilling"


@dataclass
class Parked:
    """A preempted request's place, kept while it waits: its slot's KV as bytes (None when the
    snapshot failed: it is evaluated again), how many positions they hold, which of them the
    slot's prefix cache may reuse, and the status it resumes with."""

    payload: Any
    n_cells: int
    cached: list[int]
    status: Status


# The fewest tokens a request must have left to move into a hole, for each MOVE_CELLS cells of a
# slot's stream (the copy's size): below it the copy costs more than the split ticks it saves
# (docs/performance.md, "Moves").
MOVE_MIN_LEFT = 4
MOVE_CELLS = 4096


def runs_of(slot_ids: set[int]) -> int:
    """How many runs of consecutive ids `slot_ids` makes: the graph runs of a decode tick over them."""
    return sum(1 for i in slot_ids if i - 1 not in slot_ids)


class KVLedger:
    def __init__(self, n_slots: int, slot_ctx: int, cache_generated: bool = True,
                 pool_cells: int | None = None, keep_floor: Callable[[int], int] | None = None,
                 restored_whole_below: int | None = None, snapshot: Callable[[int], Any] | None = None,
                 park_budget: int = 1 << 30):
        self.slots = [Slot(i) for i in range(n_slots)]
        self.slot_ctx = slot_ctx
        # Deterministic mode reuses only KV that prefill computed: a generated token's KV comes
        # from the decode path, which rounds differently from evaluating it as prompt.
        self.cache_generated = cache_generated
        # A pool the slots share (a unified cache): a request is admitted only when all it may
        # come to hold fits beside what the others may (make_room). None: slot_ctx cells a slot.
        self.pool_cells = pool_cells
        self.keep_floor = keep_floor  # Runner.keep_floor: what the runner can still keep of a slot
        # A slot restored with fewer tokens than this may be cut back anywhere, else only from
        # its restored end (Runner.restored_whole_below).
        self.restored_whole_below = restored_whole_below
        # Preemption: snapshot(slot) gives a slot's KV as bytes (runner.snapshot). None: no parking.
        self.snapshot = snapshot
        self.park_budget = park_budget  # bytes of parked KV held at once; past it a copy is dropped
        self.parked_bytes = 0
        self._forks: list[Fork] = []  # decided, not yet handed to the runner in a plan
        self._trims: list[Trim] = []  # likewise; a plan applies its trims before its forks
        self._restores: list[Restore] = []  # likewise
        self._moves: list[Move] = []  # likewise (plan_moves, decided as a plan is made)
        self.restoring: dict[int, list[int]] = {}  # slot -> the tokens its planned Restore brings
        self._resuming: set[int] = set()  # slots whose planned Restore puts a parked request's KV back

    # -- changes decided now, applied by the next plan ------------------------------------

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
        if n_tokens < src.min_keep:
            raise ValueError(f"cannot fork {n_tokens} tokens of slot {src_slot}: restored, it keeps at least "
                             f"{src.min_keep}")
        fork = Fork(src_slot, dst_slot, n_tokens)
        dst.cached = src.cached[:n_tokens]
        dst.min_keep = src.min_keep
        self._forks.append(fork)
        return fork

    def trim(self, slot_id: int, n_keep: int) -> Trim:
        """Decide a KV trim (see plan.Trim): the slot will hold only its first `n_keep` tokens.
        The bookkeeping changes now; the trim rides on the next plan, where the runner applies
        it first, before that plan's forks and its decode."""
        slot = self.slots[slot_id]
        if not 0 <= n_keep <= len(slot.cached):
            raise ValueError(f"cannot keep {n_keep} tokens of slot {slot_id} (holds {len(slot.cached)})")
        if 0 < n_keep < slot.min_keep:
            raise ValueError(f"cannot keep {n_keep} tokens of slot {slot_id}: restored, it keeps at least "
                             f"{slot.min_keep}")
        trim = Trim(slot_id, n_keep)
        slot.cached = slot.cached[:n_keep]
        if n_keep == 0:
            slot.min_keep = 0
        self._trims.append(trim)
        return trim

    def plan_restore(self, restore: Restore, tokens: list[int]) -> None:
        """Decide a Restore: the slot holds `tokens` once it has run (take_restore)."""
        self._restores.append(restore)
        self.restoring[restore.slot] = tokens
        if restore.resume:
            self._resuming.add(restore.slot)

    def take_changes(self) -> tuple[list[Fork], list[Trim], list[Restore], list[Move]]:
        """The changes decided since the last plan, for the next one."""
        forks, self._forks = self._forks, []
        trims, self._trims = self._trims, []
        restores, self._restores = self._restores, []
        moves, self._moves = self._moves, []
        return forks, trims, restores, moves

    # -- no holes: moves between per-slot streams -----------------------------------------------

    def plan_moves(self, ticking: set[int], min_left: int, now: float, reserved_from: int | None = None) -> list[Move]:
        """Fill the idle slots between busy ones (with a KV stream per slot llama.cpp runs a tick
        in one graph run only across consecutive slots) by moving the request on the highest busy
        slot into the lowest such hole, while one may move: its slot has a row in this tick's
        plan (`ticking`: that chunk performs the copy), nothing else pending touches either slot,
        and it has at least `min_left` tokens still to go, below which the copy costs more than
        the split ticks it saves (docs/performance.md, "Moves"). Nothing crosses into or out of
        the reserved slots (from `reserved_from` on), which keep their own requests. Only moves
        that leave fewer runs of consecutive busy slots are made. Call before the plan's chunks
        are made: they go to the new slots."""
        busy = {s.slot_id for s in self.slots if s.seq is not None}
        blocked = self.changing()
        split = len(self.slots) if reserved_from is None else reserved_from
        pairs: list[tuple[Slot, Slot]] = []
        for region in (self.slots[:split], self.slots[split:]):
            here = [s.slot_id for s in region if s.seq is not None]
            if not here:
                continue
            holes = [s for s in self.slots[min(here):max(here)] if s.seq is None and s.slot_id not in blocked]
            movers = [s for s in reversed(region) if s.seq is not None and s.slot_id in ticking
                      and s.slot_id not in blocked and self._may_move(s.seq, min_left)]
            pairs += [(src, hole) for hole, src in zip(holes, movers) if src.slot_id > hole.slot_id]
        after = (busy - {src.slot_id for src, _ in pairs}) | {hole.slot_id for _, hole in pairs}
        if not pairs or runs_of(after) >= runs_of(busy):
            return []
        return [self._move(src, hole, now) for src, hole in pairs]

    def _may_move(self, seq: Sequence, min_left: int) -> bool:
        """Whether seq's place can change between ticks with nothing of its own pending: not put
        aside, not awaiting a token sampled apart (its job names the slot), nor a prefix save of
        its slot, and with enough answer left for the copy to pay."""
        if seq.status not in (Status.GENERATING, Status.PREFILLING) or seq.kv.parked is not None:
            return False
        if seq.sampling_apart or seq.kv.save_at is not None:
            return False
        left = min(seq.params.max_tokens - len(seq.answer.output), self.slot_ctx - seq.num_tokens)
        return left + seq.num_pending >= min_left

    def _move(self, src: Slot, dst: Slot, now: float) -> Move:
        """Decide one Move: dst takes src's request and a copy of its cache; src keeps its cells
        as an idle slot's cache (a stream per slot: they take no room anyone else could)."""
        seq = src.seq
        move = Move(src.slot_id, dst.slot_id, seq.kv.num_computed)  # type: ignore[union-attr]
        dst.cached, dst.min_keep = list(src.cached), src.min_keep
        dst.seq, src.seq = seq, None
        dst.last_used = src.last_used
        src.last_used = now
        seq.kv.slot = dst.slot_id  # type: ignore[union-attr]
        self._moves.append(move)
        return move

    def fork_ends(self) -> set[int]:
        """Slots a decided fork reads or fills: they keep their KV until that plan has run."""
        return {f.src_slot for f in self._forks} | {f.dst_slot for f in self._forks}

    def refilled(self) -> set[int]:
        """Slots a decided trim or fork leaves holding a new length of tokens."""
        return {t.slot for t in self._trims} | {f.dst_slot for f in self._forks}

    def changing(self) -> set[int]:
        """Slots whose KV anything decided and not yet applied touches."""
        moved = {m.src_slot for m in self._moves} | {m.dst_slot for m in self._moves}
        return self.refilled() | self.fork_ends() | set(self.restoring) | moved

    def refresh_min_keep(self) -> None:
        """Raise each slot's min_keep to what the runner can still keep of it, before admission
        chooses what a new request reuses or forks (nothing changes the cache until the plan)."""
        if self.keep_floor is None:
            return
        for slot in self.slots:
            if slot.cached and slot.slot_id not in self.restoring:
                slot.min_keep = max(slot.min_keep, self.keep_floor(slot.slot_id))

    def restored_min_keep(self, n_cells: int) -> int:
        """The shortest prefix a slot restored with `n_cells` tokens may be cut back to: any (0)
        when the restore brought every position back, else only its restored end, so a line put
        aside leaves its slot's prompt prefix to the next line as an evaluated slot does
        (docs/performance.md, "Scheduler notes")."""
        whole = self.restored_whole_below
        return 0 if whole is not None and n_cells < whole else n_cells

    # -- what a plan did --------------------------------------------------------------------

    def take_restore(self, slot_id: int, ok: bool) -> None:
        """What a planned Restore gave: the slot holds the entry's tokens, or nothing."""
        tokens = self.restoring.pop(slot_id, [])
        slot = self.slots[slot_id]
        if slot_id in self._resuming:
            self._resuming.discard(slot_id)
            if slot.seq is not None and slot.seq.kv.parked is not None and slot.seq.status == Status.RESTORING:
                self.resumed(slot.seq, slot, ok)
            else:  # ended meanwhile: its cells are no prefix anyone asked for
                slot.cached, slot.min_keep = [], 0
                self.trim(slot_id, 0)
            return
        slot.cached = tokens if ok else []
        slot.min_keep = self.restored_min_keep(len(slot.cached))
        seq = slot.seq
        if seq is None or seq.status != Status.RESTORING:
            return  # ended meanwhile: the slot keeps what it holds for a later request
        seq.kv.num_computed = seq.kv.num_cached = seq.kv.num_restored = len(slot.cached)
        seq.status = Status.PREFILLING

    def emptied(self, slot_id: int) -> None:
        """The runner emptied a slot it could not trim or fork as planned (StepResult.emptied):
        its request evaluates its prompt and answer so far again, then samples on."""
        slot = self.slots[slot_id]
        slot.cached, slot.min_keep = [], 0
        seq = slot.seq
        if seq is None or seq.status not in (Status.PREFILLING, Status.GENERATING):
            return
        seq.kv.num_computed = seq.kv.num_cached = seq.kv.num_restored = 0
        seq.status = Status.PREFILLING
        seq.kv.save_at = None  # a planned save of a prefix it was to reuse: an optimisation only

    def evaluated(self, chunk: Chunk, seq: Sequence, result: StepResult) -> None:
        """A chunk the tick evaluated: its cells join the slot, and of its guesses those the
        verification kept (the tokens join the output in the output step)."""
        slot = self.slots[chunk.slot]
        evaluated = len(chunk.tokens) - chunk.n_draft  # the guesses' cells are kept as verified
        seq.kv.num_computed += evaluated
        if self.cache_generated or not chunk.is_decode:
            slot.cached.extend(chunk.tokens[:evaluated])
        if chunk.n_draft:
            self._keep_verified(chunk, seq, result.accepted.get(chunk.slot, 0) if chunk.slot in result.sampled else 0)

    def _keep_verified(self, chunk: Chunk, seq: Sequence, kept: int) -> None:
        """A verified chunk: its first `kept` guesses' cells stay, the other guesses' cells go by
        a Trim in the next plan."""
        evaluated = len(chunk.tokens) - chunk.n_draft
        seq.kv.num_computed += kept
        slot = self.slots[chunk.slot]
        if self.cache_generated:
            slot.cached.extend(chunk.tokens[evaluated:evaluated + kept])
        if kept < chunk.n_draft:
            self._trims.append(Trim(chunk.slot, chunk.start_pos + evaluated + kept))
            if self.cache_generated:
                del slot.cached[chunk.start_pos + evaluated + kept:]
        seq.answer.rejected_drafts += chunk.n_draft - kept
        if seq.drafter is not None:
            seq.drafter.observe(chunk.n_draft, kept)

    def release(self, seq: Sequence, now: float) -> None:
        """seq has ended: its slot goes idle, keeping its cache for a later request."""
        slot = self.slots[seq.kv.slot]  # type: ignore[index]
        if slot.seq is seq:
            slot.seq = None
            slot.last_used = now

    # -- parking: a preempted request's KV kept as bytes --------------------------------------

    def park(self, member: Sequence, now: float) -> Slot:
        """Put one running sample aside: its slot's KV as bytes (a copy taken now, before any plan
        changes the slot; none for a sample still waiting for the prompt's fork), kept within
        the budget, and the slot freed. Returns the slot."""
        slot = self.slots[member.kv.slot]  # type: ignore[index]
        payload = None
        if member.status != Status.FORKING:
            try:
                payload = self.snapshot(slot.slot_id)  # type: ignore[misc]
            except Exception:  # no memory for the copy: it is evaluated again when it resumes
                payload = None
        if payload is not None and self.parked_bytes + len(payload) > self.park_budget:
            payload = None  # past the budget: dropped, evaluated again when it resumes
        self.parked_bytes += len(payload) if payload is not None else 0
        member.kv.parked = Parked(payload, member.kv.num_computed, list(slot.cached), member.status)
        member.clock.preemptions += 1
        member.clock.paused_at = now
        member.kv.save_at = None  # a prefix save planned for it is dropped (an optimisation only)
        member.kv.slot = None
        member.status = Status.WAITING
        slot.seq = None
        slot.last_used = now
        return slot

    def plan_resume(self, member: Sequence, slot: Slot) -> None:
        """A parked sample takes `slot`: emptied, and its KV put back by a Restore when it has bytes."""
        slot.seq = member
        self.trim(slot.slot_id, 0)
        parked = member.kv.parked
        if parked.payload is not None:  # type: ignore[union-attr]
            self.plan_restore(Restore(slot.slot_id, parked.n_cells, parked.payload, resume=True),  # type: ignore[union-attr]
                              parked.cached)  # type: ignore[union-attr]

    def resumed(self, seq: Sequence, slot: Slot, ok: bool) -> None:
        """What a parked request's Restore gave: its KV where it stopped, or (refused, or no
        bytes to restore) nothing, and it evaluates its prompt and answer so far again."""
        parked, seq.kv.parked = seq.kv.parked, None
        self.unpark_bytes(parked)
        if ok:
            slot.cached = list(parked.cached)  # type: ignore[union-attr]
            slot.min_keep = self.restored_min_keep(parked.n_cells)  # type: ignore[union-attr]
            seq.kv.num_computed = parked.n_cells  # type: ignore[union-attr]
            seq.status = parked.status  # type: ignore[union-attr]
        elif parked.status == Status.FORKING:  # type: ignore[union-attr]
            slot.cached, slot.min_keep = [], 0
            seq.kv.num_computed = 0
            seq.status = Status.FORKING  # it waits for the prompt's fork again, as when first admitted
        else:
            slot.cached, slot.min_keep = [], 0
            seq.kv.num_computed = 0
            seq.status = Status.PREFILLING  # the answer so far is evaluated as prompt; then it samples on
        if seq.clock.paused_at is not None:
            seq.clock.paused_ms += (time.perf_counter() - seq.clock.paused_at) * 1000
            seq.clock.paused_at = None

    def unpark_bytes(self, parked: Parked | None) -> None:
        if parked is not None and parked.payload is not None:
            self.parked_bytes -= len(parked.payload)

    # -- room in a shared KV pool ------------------------------------------------------------

    def reserved_for(self, seq: Sequence) -> int:
        """The cells a request (all its samples) may come to hold in a pool: its prompt and
        max_tokens, at most slot_ctx each. Guesses stay within it (speculation._room)."""
        if self.pool_cells is None:
            return 0
        return sum(min(self.slot_ctx, len(m.prompt) + m.params.max_tokens) for m in seq.members)

    def room_left(self) -> int:
        """Cells of the pool neither reserved by a running request nor kept by an idle slot's
        cache (shared cells of forks count once per slot: never less room than there is)."""
        if self.pool_cells is None:
            return 1 << 62
        held = 0
        for slot in self.slots:
            held += self.reserved_for(slot.seq) if slot.seq is not None else len(slot.cached)
        return self.pool_cells - held

    def make_room(self, seq: Sequence, idle: list[Slot]) -> bool:
        """Whether `seq` fits the pool now, emptying idle slots' caches (least recently used
        first) when it fits only without them. Always True with a stream per slot."""
        if self.pool_cells is None:
            return True
        need, left = self.reserved_for(seq), self.room_left()
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
