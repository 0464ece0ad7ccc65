"""The output step: a row's sampled, forced and kept-guess tokens joining its request's answer.

Each token is detokenized as it comes (detok.py), and after each one the request's end is
checked: end of generation, a stop string, max_tokens, the slot's context. Token bytes and
the end-of-generation check come in as callables so tests can drive it with a scripted fake
vocabulary. Never imports llama_cpp.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import InvalidRequest
from .detok import IncrementalDetokenizer
from .kv_ledger import KVLedger
from ..plan import Chunk
from ..sequence import Sequence, Status
from ..thinking import ReasoningSplit


@dataclass
class SeqEvent:
    """What a tick did to one sequence: text to stream and whether it just finished."""

    seq: Sequence
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    reasoning: str = ""  # a thinking answer's reasoning text (core/thinking.py); `text` is then its content
    finished: bool = False
    forced: int = 0  # of `tokens`, those its grammar forced (unsampled)
    accepted: int = 0  # of `tokens`, draft tokens its verification kept (core/drafts.py)


class OutputStep:
    def __init__(self, ledger: KVLedger, token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool],
                 finish: Callable[..., str], take_forced: Callable[[Any, list[int]], None] | None = None):
        self.ledger = ledger
        self.token_bytes = token_bytes
        self.is_eog = is_eog
        self.finish = finish  # Scheduler.finish: gives a request its terminal status and frees its slot
        # the runner's Runner.accept_forced: a sampler (and its grammar) told of tokens the engine wrote
        self.take_forced = take_forced or (lambda _sampler, _tokens: None)
        self._detok: dict[Sequence, IncrementalDetokenizer] = {}  # by sequence: the n samples share an id
        # a thinking answer's stop strings, watched in its content only (its detokenizer watches none):
        # a stop string the reasoning happens to write does not end the answer
        self._content_stops: dict[Sequence, IncrementalDetokenizer] = {}

    def begin(self, seq: Sequence) -> None:
        """seq starts answering: its text is decoded (and its stop strings watched) from here."""
        if seq.thinking is None:
            self._detok[seq] = IncrementalDetokenizer(seq.params.stop)
            return
        self._detok[seq] = IncrementalDetokenizer()
        self._content_stops[seq] = IncrementalDetokenizer(seq.params.stop)
        seq.answer.reasoning_split = ReasoningSplit(seq.thinking)

    def end(self, seq: Sequence, reason: str) -> tuple[str, str]:
        """seq ends: its full text (and a thinking answer's reasoning) is set. Returns any
        held-back (text, reasoning): a cancelled or timed-out request's partial stop-string match
        is part of its answer, and so is what a thinking answer's split still holds."""
        tail = ""
        detok = self._detok.pop(seq, None)
        if detok is not None and not detok.stopped and reason in ("cancelled", "timeout"):
            tail = detok.finish()
        split, seq.answer.reasoning_split = seq.answer.reasoning_split, None
        watch = self._content_stops.pop(seq, None)
        if split is None or watch is None:
            if detok is not None:
                seq.answer.text = detok.text
            return tail, ""
        if detok is not None and reason == "length":
            tail = detok.finish()  # no stop strings held here: only a character's first bytes
        content, reasoning = split.feed(tail)
        more = split.finish()
        content = watch.push_text(content + more[0]) + watch.finish()  # "" once a stop string ended it
        seq.answer.text, seq.answer.reasoning = watch.text, split.reasoning_text
        seq.answer.reasoning_tokens = split.tokens
        return content, reasoning + more[1]

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
            sample.kv.num_computed = sample.kv.num_cached = len(sample.prompt)
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
        split = seq.answer.reasoning_split
        for tok, lp, kind in steps:
            if event.finished:
                break
            more = self._accept_one(seq, tok, lp, split)
            self._join(event, more)
            if kind == "forced" and more.tokens:  # a forced end of generation is not part of the answer
                event.forced += 1
                seq.answer.forced_tokens += 1
            elif kind == "guess" and more.tokens:
                event.accepted += 1
                seq.answer.accepted_drafts += 1
        if split is not None and not event.finished and split.must_close():
            self._close_block(seq, split, event)
        return event

    @staticmethod
    def _join(event: SeqEvent, more: SeqEvent) -> None:
        event.tokens += more.tokens
        event.text += more.text
        event.reasoning += more.reasoning
        event.finished = more.finished

    def _close_block(self, seq: Sequence, split: ReasoningSplit, event: SeqEvent) -> None:
        """The thinking budget ran out: the engine writes the block's closer itself (its tokens
        evaluated next tick, as a grammar's forced ones are), and the answer follows."""
        split.closing = True
        tokens = list(seq.thinking.close_tokens)
        try:
            self.take_forced(seq.sampler, tokens)
        except InvalidRequest as exc:  # its grammar cannot take the closer: that request's error
            self.finish(seq, "error", str(exc), exc.code)
            event.finished = True
            return
        for tok in tokens:
            if event.finished:
                break
            lp = None if seq.answer.logprobs is None else {"token": self.token_bytes(tok).decode("utf-8", "replace"),
                                                     "id": tok, "logprob": 0.0, "top_logprobs": []}
            self._join(event, self._accept_one(seq, tok, lp, split, counted=False))

    def _accept_one(self, seq: Sequence, token: int, logprob: dict | None, split: ReasoningSplit | None = None,
                    counted: bool = True) -> SeqEvent:
        now = time.perf_counter()
        if seq.clock.first_token_at is None:
            seq.clock.first_token_at = now
        seq.status = Status.GENERATING  # also a resumed request that evaluated its answer again
        detok = self._detok[seq]
        event = SeqEvent(seq)
        if self.is_eog(token):
            # Not part of the answer. ignore_eos bans EOG in the runner's sampler, so one that
            # still comes out means the request's grammar allows nothing else: it is done.
            event.text = detok.finish()
            self._split_text(event, split, self._content_stops.get(seq))
            self._ended(event, self.finish(seq, "stop"))
            event.finished = True
            return event
        seq.answer.output.append(token)
        event.tokens.append(token)
        if seq.drafter is not None:
            seq.drafter.extend((token,))
        if logprob is not None and seq.answer.logprobs is not None:
            seq.answer.logprobs.append(logprob)
        if split is not None and counted:
            split.count()
        event.text = detok.push(self.token_bytes(token))
        at_end = len(seq.answer.output) >= seq.params.max_tokens or seq.num_tokens >= self.ledger.slot_ctx
        if at_end and not detok.stopped and split is None:
            event.text += detok.finish()
        self._split_text(event, split, self._content_stops.get(seq))
        stops = self._content_stops.get(seq, detok)
        if stops.stopped:
            seq.answer.stop_hit = stops.stop_hit
            self._ended(event, self.finish(seq, "stop"))
        elif at_end:
            self._ended(event, self.finish(seq, "length"))
        event.finished = seq.finished
        return event

    @staticmethod
    def _ended(event: SeqEvent, tail: tuple[str, str]) -> None:
        """What a thinking answer's split still held when the engine ended it (a plain answer's
        detokenizer gave its own tail already)."""
        event.text += tail[0]
        event.reasoning += tail[1]

    @staticmethod
    def _split_text(event: SeqEvent, split: ReasoningSplit | None, stops: IncrementalDetokenizer | None) -> None:
        """A thinking answer's new text as its content (its stop strings watched) and reasoning."""
        if split is not None and stops is not None and event.text:
            content, event.reasoning = split.feed(event.text)
            event.text = stops.push_text(content)
