"""Which slots to save to the disk prefix store (disk_prefix.py), and when.

A prefix two requests share, or a prompt its request asked to keep (store_prefix), is saved
once a slot holds exactly it: a restored entry continues only from its end (plan.Restore), so
the entry must be the shared part itself, not a slot that went further. A prefilling request
marks where (`Sequence.kv.save_at`), the tick's chunk ends there, and the engine snapshots the
slot after the tick (take). Never imports llama_cpp.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..plan import Chunk, StepPlan
from ..prefixes.prefix import longest_shared
from ..sequence import Sequence, Status

if TYPE_CHECKING:
    from ..prefixes.disk_prefix import DiskPrefixes
    from .kv_ledger import Slot


@dataclass
class PrefixToSave:
    """A slot that holds exactly `tokens` (a prefix worth keeping) after the tick that just ran:
    the engine snapshots it into the disk prefix store before the next plan changes it."""

    seq: Sequence
    slot: int
    tokens: list[int]


class PrefixSaves:
    def __init__(self, disk: "DiskPrefixes | None", slots: "list[Slot]"):
        self.disk = disk  # None: no store, nothing is ever marked
        self.slots = slots
        self._due: list[PrefixToSave] = []  # slots holding a prefix to save, after the last update

    def mark(self, seq: Sequence, n: int) -> None:
        """`seq`'s first `n` prompt tokens are shared with another request: if the store lacks
        them and seq's prefill has not passed them yet, save its slot when exactly they are in it."""
        if self.disk is None or n < self.disk.save_min or seq.status not in (Status.WAITING, Status.PREFILLING):
            return
        if seq.kv.num_computed >= n or (seq.kv.save_at is not None and seq.kv.save_at <= n):
            return  # passed already, or a save of a shorter (more widely shared) prefix is planned
        if self.disk.has(seq.prompt[:n]):
            return
        seq.kv.save_at = n

    def mark_prompt(self, seq: Sequence) -> None:
        """A request that asked for its prompt to be kept: its slot holds exactly it after its last chunk."""
        if seq.params.store_prefix and self.disk is not None and seq.index == 0:
            seq.kv.save_at = len(seq.prompt)

    def mark_queued(self, waiting: deque[Sequence]) -> None:
        """Requests still queued (every slot busy) that share a prefix with a running prompt:
        mark the running one to save it, as admission does for a request it holds back."""
        prefilling = [s for s in self.slots if s.seq is not None and s.seq.status == Status.PREFILLING]
        if not prefilling:
            return
        for seq in list(waiting)[: len(self.slots)]:
            evaluator, shared = longest_shared(seq.prompt, [(s.slot_id, s.seq.prompt) for s in prefilling])  # type: ignore[union-attr]
            if evaluator is not None:
                self.mark(self.slots[evaluator].seq, shared)  # type: ignore[arg-type]

    def sits_out(self, seq: Sequence, refilled: set[int]) -> bool:
        """Whether a prefilling request waits this tick for its slot to be saved: this plan trims
        or forks the slot to exactly the prefix (take_waiting saves it after the plan has run).
        A save nothing in this plan makes due is dropped."""
        if seq.kv.save_at is None or seq.kv.save_at != seq.kv.num_computed:
            return False
        if seq.kv.slot in refilled:
            return True
        seq.kv.save_at = None
        return False

    @staticmethod
    def chunk_end(seq: Sequence, n: int) -> int:
        """The tokens of seq's chunk, `n` cut to end where the prefix to save ends."""
        if seq.kv.save_at is not None and seq.kv.num_computed < seq.kv.save_at < seq.kv.num_computed + n:
            return seq.kv.save_at - seq.kv.num_computed
        return n

    def reached(self, seq: Sequence, chunk: Chunk) -> None:
        """After seq's chunk was evaluated: its slot holds exactly the prefix to save."""
        if seq.kv.save_at is not None and seq.kv.num_computed == seq.kv.save_at and not chunk.is_decode:
            self._due.append(PrefixToSave(seq, chunk.slot, list(self.slots[chunk.slot].cached)))
            seq.kv.save_at = None

    def take_waiting(self, plan: StepPlan) -> None:
        """Requests that sat this tick out so their slot, trimmed or forked to exactly a prefix
        worth keeping by this plan, is saved now. A trim is done when the plan has run; a fork's
        copy (a KV stream per slot) only inside a llama_decode, so after a plan that decoded
        nothing a forked copy is not saved (the request goes on regardless)."""
        trimmed = {t.slot for t in plan.trims}
        forked = {f.dst_slot for f in plan.forks}
        for slot in self.slots:
            seq = slot.seq
            if seq is None or seq.status != Status.PREFILLING or seq.kv.save_at != seq.kv.num_computed:
                continue
            if (slot.slot_id in forked and plan.chunks) or (slot.slot_id in trimmed and slot.slot_id not in forked):
                self._due.append(PrefixToSave(seq, slot.slot_id, list(slot.cached)))
            seq.kv.save_at = None

    def take(self) -> list[PrefixToSave]:
        """The slots to snapshot now (each holds exactly its PrefixToSave.tokens)."""
        saves, self._due = self._due, []
        return saves
