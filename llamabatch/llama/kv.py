"""A context's KV memory, changed only as plans say: Trim, Fork and Move (their docstrings in
core/plan.py are the contract), plus the position queries and rollbacks the execute
paths need."""
from __future__ import annotations

import sys
from typing import Any

from llama_cpp import llama_cpp as C

from ..core.plan import Fork, Move, Trim


class KvCache:
    def __init__(self, ctx: Any, model: Any, *, swa_full: bool, kv_unified: bool):
        self.mem = C.llama_get_memory(ctx)
        self.kv_unified = kv_unified
        self.swa_full = swa_full
        # Keeping part of a sequence (a Trim with n_keep > 0, the trimmed copy of a Fork):
        # recurrent and hybrid memories cannot remove part of a sequence, and without the
        # full-size SWA cache the early cells may already be gone (Gemma 3: a 512-token window).
        self.n_swa = max(0, int(C.llama_model_n_swa(model)))  # 0: no sliding-window layers
        self.cannot_cut_at_all = bool(C.llama_model_is_recurrent(model) or C.llama_model_is_hybrid(model))
        self.can_cut = (swa_full or self.n_swa == 0) and not self.cannot_cut_at_all

    def can_undo(self, ends: list[int]) -> bool:
        """Whether removing a batch's cells again (from each sequence's first position in it)
        restores the memory as it was, for a batch whose sequences end at positions `ends`
        (exclusive). A decode of several graph runs may overwrite a window layer's cells that have
        left the window; none has while every position is below the window, and none ever does
        in a full-size SWA cache or a model without windows. Recurrent state cannot be cut at all."""
        if self.cannot_cut_at_all:
            return False
        return self.can_cut or all(end < self.n_swa for end in ends)

    def next_pos(self, seq: int) -> int:
        """How many positions sequence `seq` holds (its last position + 1; 0 when empty)."""
        return C.llama_memory_seq_pos_max(self.mem, seq) + 1

    def drop_from(self, seq: int, pos: int) -> None:
        """Remove sequence `seq`'s cells at positions >= pos (-1: all of them)."""
        C.llama_memory_seq_rm(self.mem, seq, pos, -1)

    def keep_floor(self, seq: int) -> int:
        """The shortest prefix of sequence `seq` that a trim may keep right now (0: any).

        A window layer's cell leaves the cache once no later position of its own sequence sees
        it: llama.cpp's cell search reuses it for any sequence, and in one cache shared by
        every slot that happens whenever the search wraps onto an idle slot's cached prompt. What
        remains of the window layers is a run from `seq_pos_min` on, and continuing at n needs
        their last n_swa positions before n."""
        if not self.n_swa:
            return 0
        lowest = C.llama_memory_seq_pos_min(self.mem, seq)
        if lowest < 0:
            return sys.maxsize  # every cell went: nothing of it can be kept
        return 0 if lowest == 0 else lowest + self.n_swa

    def trim(self, trim: Trim) -> bool:
        """Apply one plan.Trim. False: the window layers no longer hold what continuing at
        n_keep needs (keep_floor), and the slot is emptied instead, for its request to
        evaluate its tokens again."""
        slot, n_keep = trim.slot, trim.n_keep
        if n_keep <= 0:
            C.llama_memory_seq_rm(self.mem, slot, -1, -1)
            return True
        if not self.can_cut:
            raise RuntimeError(f"bad trim {trim}: this model's memory cannot keep part of a slot "
                               "(recurrent/hybrid or no full SWA cache)")
        held = self.next_pos(slot)
        if n_keep > held:
            raise RuntimeError(f"bad trim {trim}: the slot holds {held} tokens")
        # Trust, but verify: a sliding-window cache can report success after the cells the
        # continuation needs have already been reused (keep_floor says when), and when every
        # cell it still held was past n_keep, what is left is nothing at all.
        if C.llama_memory_seq_rm(self.mem, slot, n_keep, -1) and self._continues_at(slot, n_keep):
            return True
        C.llama_memory_seq_rm(self.mem, slot, -1, -1)
        return False

    def _continues_at(self, seq: int, n: int) -> bool:
        """Whether sequence `seq` holds positions up to n - 1 and, of the window layers, the
        last n_swa positions before n: what evaluating position n needs (keep_floor's rule)."""
        needed_from = max(0, n - self.n_swa) if self.n_swa else 0
        return self.next_pos(seq) == n and 0 <= C.llama_memory_seq_pos_min(self.mem, seq) <= needed_from

    def fork(self, fork: Fork) -> bool:
        """Apply one plan.Fork. Between per-slot streams: copy the source's whole stream, then
        trim the copy (llama.cpp queues the copy and does it at the start of the next
        llama_decode, before that decode's tokens are placed). In a unified cache: share the
        source's cells [0, n_tokens). False: the source's window layers no longer hold what
        continuing the copy at n_tokens needs (keep_floor), and the destination is emptied."""
        if not self.can_cut:
            raise RuntimeError("this model's memory cannot fork a slot (recurrent/hybrid or no full SWA cache)")
        src, dst, n = fork.src_slot, fork.dst_slot, fork.n_tokens
        held = self.next_pos(src)
        if src == dst or n <= 0 or n > held:
            raise RuntimeError(f"bad fork {fork}: the source slot holds {held} tokens")
        if self.kv_unified:
            C.llama_memory_seq_rm(self.mem, dst, -1, -1)
            C.llama_memory_seq_cp(self.mem, src, dst, 0, n)
        else:
            C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)  # never a range between streams: see plan.Fork
            if not C.llama_memory_seq_rm(self.mem, dst, n, -1):
                C.llama_memory_seq_rm(self.mem, dst, -1, -1)
                raise RuntimeError(f"could not trim the copy of slot {src} in slot {dst} to {n} tokens")
        if self._continues_at(dst, n):  # cell metadata is copied at once, the data later
            return True
        C.llama_memory_seq_rm(self.mem, dst, -1, -1)
        return False

    def move(self, move: Move) -> bool:
        """Apply one plan.Move: the destination stream becomes a copy of the source's whole
        stream (cell metadata now, the buffers at the start of the next llama_decode); the source
        keeps its cells. False: the copy does not hold the request's positions, and the
        destination is emptied for its request to evaluate its tokens again."""
        if self.kv_unified:
            raise RuntimeError(f"bad move {move}: one KV cache the slots share has no streams to move between")
        src, dst = move.src_slot, move.dst_slot
        if src == dst or self.next_pos(src) != move.n_tokens:
            C.llama_memory_seq_rm(self.mem, dst, -1, -1)
            return False
        C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)  # the whole stream: see plan.Fork
        if self._continues_at(dst, move.n_tokens):
            return True
        C.llama_memory_seq_rm(self.mem, dst, -1, -1)
        return False
