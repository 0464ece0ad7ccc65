"""The output step: a row's sampled, forced and kept-guess tokens joining its request's answer.

Each token is detokenized as it comes (detok.py), and after each one the request's end is
checked: end of generation, a stop string, max_tokens, the slot's context. Token bytes and
the end-of-generation check come in as callables so tests can drive it with a scripted fake
vocabulary. Never imports llama_cpp.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .detok import IncrementalDetokenizer
from .kv_ledger import KVLedger
from .plan import Chunk
from .sequence import Sequence, Status


@dataclass
class SeqEvent:
    """What a tick did to one sequence: text to stream and whether it just finished."""

    seq: Sequence
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    forced: int = 0  # of `tokens`, those its grammar forced (unsampled)
    accepted: int = 0  # of `tokens`, draft tokens its verification kept (core/drafts.py)


class OutputStep:
    def __init__(self, ledger: KVLedger, token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool],
                 finish: Callable[[Sequence, str], str]):
        self.ledger = ledger
        self.token_bytes = token_bytes
        self.is_eog = is_eog
        self.finish = finish  # Scheduler.finish: gives a request its terminal status and frees its slot
        self._detok: dict[Sequence, IncrementalDetokenizer] = {}  # by sequence: the n samples share an id

    def begin(self, seq: Sequence) -> None:
        """seq starts answering: its text is decoded (and its stop strings watched) from here."""
        self._detok[seq] = IncrementalDetokenizer(seq.params.stop)

    def end(self, seq: Sequence, reason: str) -> str:
        """seq ends: its full text is set. Returns any held-back text (a cancelled or timed-out
        request's partial stop-string match is part of its answer)."""
        tail = ""
        detok = self._detok.pop(seq, None)
        if detok is not None and not detok.stopped and reason in ("cancelled", "timeout"):
            tail = detok.finish()
        if detok is not None:
            seq.text = detok.text
        return tail

    def take_row(self, chunk: Chunk, seq: Sequence, sampled: dict[int, int],
                 logprobs: dict[int, dict], forced: dict[int, list[int]], accepted: dict[int, int] | None = None,
                 accepted_logprobs: dict[int, list[dict]] | None = None) -> list[SeqEvent]:
        """The tokens of `chunk`'s row, and of the sibling samples that share its prompt."""
        events = []
        if chunk.wants_logits and chunk.slot in sampled:
            guesses = self._kept_guesses(chunk, accepted or {}, accepted_logprobs or {})
            events.append(self._accept(seq, sampled[chunk.slot], logprobs.get(chunk.slot), forced.get(chunk.slot),
                                       guesses))
        for slot_id, _ in chunk.siblings:
            sample = self.ledger.slots[slot_id].seq
            if sample is None or sample.status != Status.FORKING or slot_id not in sampled:
                continue
            # Its prompt KV is sample 0's, copied by a fork before the next decode.
            self.ledger.fork(chunk.slot, slot_id, len(sample.prompt))
            sample.num_computed = sample.num_cached = len(sample.prompt)
            events.append(self._accept(sample, sampled[slot_id], logprobs.get(slot_id), forced.get(slot_id)))
        return events

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
            # Not part of the answer. ignore_eos bans EOG in the runner's sampler, so one that
            # still comes out means the request's grammar allows nothing else: it is done.
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
        elif len(seq.output) >= seq.params.max_tokens or seq.num_tokens >= self.ledger.slot_ctx:
            event.text += detok.finish()
            self.finish(seq, "length")
        event.finished = seq.finished
        return event
