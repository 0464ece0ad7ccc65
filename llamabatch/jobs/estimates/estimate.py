"""What a job would cost, before running it (`estimate_job`, `llamabatch run --dry-run`).

Every line goes through the same parser as a real run (same errors), chat lines through
the model's chat template, and every prompt through the tokenizer; nothing is generated and
nothing is written (OUTPUT, the manifest and the retry journal are only read). The model is
loaded in this process with one small slot: only its tokenizer and template are used.
Memory stays constant however long INPUT is: ids in 8-byte fingerprints, lengths in a
histogram, prefix reuse over the last few prompts (estimate_arithmetic.py).

With --resume: lines OUTPUT (and the error file) already answer are left out of the totals,
--retry-failed counts the retryable errors back in, and OUTPUT ids that are not in INPUT
are reported (a resume never silently keeps them).

With n_ctx auto (and a file INPUT, as `run` sizes only those: context_fit.py) the context
is the run's rule, settings/context_sizing.plan_context, over what every line needs (prompt
tokens + max_tokens, once per sample), and only a line whose prompt is at least what one
request may hold under that plan is a context_overflow. The plan is known after the last
line, so a line needing more than a default slot waits for it as a few numbers (its prompt
may not fit, its max_tokens may be clipped); the needs are a histogram. Such a line is
counted in the prefix reuse as it is read; if it then can never fit, its own share comes
off again (lines after it were compared with it too: an estimate).
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any, Callable

from ...config import DEFAULT_CTX_PER_SLOT
from ...errors import InvalidRequest, LlamaBatchError
from ...settings import context_sizing
from ...settings.kv_layout import layout_for, note_line
from ...settings.resolved import Resolved
from ...settings.slots import planned_slots
from ...core.overflow_words import prompt_overflow, trained_context
from .estimate_arithmetic import AutoBounds, LengthStats, PrefixReuse, RECENT, eta, request_room
from ..reading.input_source import count_nonblank, open_input
from ..writing.output_sink import stream_kind
from ...openai_format import LineError, LineParser, LineRequest, duplicate_id_error, is_unnamed_error, record_id
from ..resume.id_sets import Answered, IdSet
from ..resume.retry_journal import is_retryable, journal_path, whole_records
from ..resume.manifest_fields import not_in_input

SHOWN_ERRORS = 5
SHOWN_FOREIGN = 5
TOKENIZER_CTX = 512  # the dry run's one slot: tokenizing needs no context
UNCALIBRATED_SLOTS = 8  # n_parallel auto with no calibration here: the slots the context is planned for


def _prompt_tokens(engine: Any, prompt: Any) -> list[int]:
    """The tokens a prompt becomes, as the engine makes them (InputPreparer.prompt_tokens)."""
    if isinstance(prompt, str):
        return engine.tokenize(prompt, special=False)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return engine.tokenize(engine.render_chat(prompt), special=True)
    return list(prompt)


def _embed_tokens(engine: Any, inputs: Any) -> list[int]:
    """An embeddings line's tokens, all its inputs together (each is checked as the engine
    checks it: core/embedding.py; an input too long for n_batch is the engine's to say)."""
    from ...core.embedding import split_inputs

    tokens: list[int] = []
    for i, item in enumerate(split_inputs(inputs)):
        if not item:
            raise InvalidRequest(f"input[{i}] is empty")
        tokens += engine.tokenize(item, special=False) if isinstance(item, str) else list(item)
    return tokens


class _OutputSide:
    """What --resume would find: answered ids, retryable ones, and OUTPUT's ids for the
    not-in-INPUT check. Read only: a torn last line is left where it is (it is no record)."""

    def __init__(self, paths: list[str]):
        self.answered = Answered()
        self.retryable = IdSet()
        self.paths = paths
        for path in paths:
            for _raw, record in whole_records(path):
                line_id = record_id(record)
                if line_id is None and not is_unnamed_error(record):
                    continue
                self.answered.add(line_id, record.get("error", {}).get("code")
                                  if isinstance(record.get("error"), dict) else None)
                if is_retryable(record):
                    self.retryable.add(line_id)


def model_facts_of(resolved: Resolved) -> tuple[int | None, int | None, int | None, str]:
    """settings/context_sizing.model_facts on the resolved model (nothing known without one)."""
    if not resolved.engine.model:
        return None, None, None, ""
    return context_sizing.model_facts(resolved.engine, resolved.engine.model)


def estimate_lines(resolved: Resolved, parser: LineParser, input_path: str, output: str | None, *,
                   resume: bool, retry_failed: bool, error_file: str | None, stdin: Any,
                   open_tokenizer: Callable[[Resolved], Any], table_source: Any = None,
                   table_rows: int | None = None, sizes_context: bool = True) -> dict[str, Any]:
    """The estimate as a JSON-ready dict (what `run --dry-run --json` prints).
    `open_tokenizer(resolved)` builds an in-process engine. A table INPUT comes opened
    (`table_source`, table_input.TableSource, with `table_rows` when its row count is known)
    and `parser` is its TableParser; `output` is then the records file. `sizes_context`: the
    run would size n_ctx auto from a file INPUT (not on Ray workers). Raises InvalidRequest
    (a resume without OUTPUT, OUTPUT a stream) or JobFileError (INPUT cannot be read)."""
    if resume and output in (None, "-"):
        raise InvalidRequest("--dry-run --resume reads OUTPUT back: give it with -o FILE")
    for path in (output, error_file) if resume else ():
        if path not in (None, "-") and stream_kind(path) is not None:  # reading a FIFO would wait for a writer
            raise InvalidRequest(f"cannot resume: {path} is {stream_kind(path)}, not a regular file")
    source = table_source if table_source is not None else open_input(input_path, stdin)
    side = _OutputSide([p for p in (output, error_file) if p]) if resume else None
    config = resolved.engine
    lines = count_nonblank(input_path) if source.is_file else table_rows
    slots, measured, at = planned_slots(config, config.model or "", lines)
    plans = config.n_ctx is None and sizes_context and source.is_file
    tokenizer = resolved.engine.replace(n_parallel=1, n_ctx=TOKENIZER_CTX)
    try:
        engine = open_tokenizer(dataclasses.replace(resolved, engine=tokenizer))
    except BaseException:
        source.close()
        raise
    runner = getattr(engine, "runner", None)  # an engine in a worker process has none here
    trained = trained_context(runner.metadata if runner is not None else None)
    fit = memory_fit(resolved, slots)
    ctx = None if plans else request_room(config if fit is None else config.replace(n_ctx=fit[0] * slots), slots,
                                          trained)
    scan = _Scan(source, side, retry_failed, ctx, slots, config.cache_prompt and not config.deterministic,
                 _Pending(fit[0] if fit else DEFAULT_CTX_PER_SLOT) if plans else None, trained,
                 pool=bool(config.kv_unified))
    try:
        scan.read(engine, parser)
    finally:
        engine.close()
        source.close()
    source_text = ("--n-parallel" if config.n_parallel != "auto" else
                   ("auto calibration" if slots else "auto, not calibrated here"))
    if plans:
        context = _auto_context(resolved, scan, slots, model_facts_of(resolved), fit)
        if slots is None and context["n_parallel"] is not None:
            source_text += f": the context is planned for up to {UNCALIBRATED_SLOTS} slots"
    else:
        context = _set_context(resolved, ctx, slots, source.is_file, fit)
    report = scan.report()
    report["slots"] = {"n_parallel": context["n_parallel"], "slot_ctx": context["slot_ctx"], "source": source_text,
                       **{k: context[k] for k in ("n_ctx", "kv_unified", "context_reason")}}
    to_evaluate = report["prompt_tokens"]["total"] - report["prefix_reuse_tokens"]
    report["eta"] = eta(context["n_parallel"], measured, at, report["max_output_tokens"], to_evaluate).as_dict()
    if resume:
        journal = journal_path(output)
        report["resume"]["pending_retry_merge"] = os.path.exists(journal)
    return report


def memory_fit(resolved: Resolved, slots: int | None) -> tuple[int, str] | None:
    """n_ctx auto's slots where max_memory does not hold a default one each: (the tokens a slot
    then gets, why), by the rule every engine applies when it opens (settings/ready.py:
    settings/context_sizing.slot_in_memory); None when nothing changes or the slots are not known."""
    config = resolved.engine
    if config.n_ctx is not None or slots is None or not config.model:
        return None
    return context_sizing.slot_in_memory(config.replace(n_parallel=slots), config.model)


def _auto_context(resolved: Resolved, scan: "_Scan", slots: int | None, facts: tuple,
                  fit: tuple[int, str] | None = None) -> dict[str, Any]:
    """n_ctx auto as the run would plan it over the lines' needs (context_fit.fit_context),
    and the waiting lines settled under it; unplanned, a default slot each, or `fit`'s."""
    model_ctx, per_token, budget, budget_text = facts
    assert scan.pending is not None
    n_parallel = slots or UNCALIBRATED_SLOTS
    plan = context_sizing.plan_context(scan.pending.planned_needs(n_parallel), n_parallel, model_ctx, per_token,
                                       budget, budget_text, pool_allowed=not resolved.engine.deterministic)
    slot = fit[0] if fit is not None else DEFAULT_CTX_PER_SLOT
    room = plan.per_request if plan is not None else slot
    never = scan.settle(room, AutoBounds.of(model_ctx, per_token, budget, budget_text))
    if plan is not None:
        return {"n_parallel": plan.n_parallel, "slot_ctx": plan.per_request, "n_ctx": plan.n_ctx,
                "kv_unified": plan.kv_unified, "context_reason": plan.reason}
    reason = fit[1] if fit is not None else context_sizing.DEFAULT_SLOT_REASON
    if never:
        reason += f"{'' if fit else ' that can fit'}; {never} line{'' if never == 1 else 's'} can never fit"
    layout = layout_for(resolved, scan.lines)  # as the run chooses it (context_fit.py)
    if layout is not None:
        reason += f"; {layout[1]}"
    return {"n_parallel": slots, "slot_ctx": slot, "n_ctx": slot * slots if slots else None,
            "kv_unified": layout[0] if layout is not None else bool(resolved.engine.kv_unified),
            "context_reason": reason}


def _set_context(resolved: Resolved, ctx: int | None, slots: int | None, file_input: bool,
                 fit: tuple[int, str] | None = None) -> dict[str, Any]:
    """The context when nothing is planned: n_ctx as set, or auto where the run does not size
    it (INPUT read as it comes, or engines on Ray workers): 4,096 tokens a slot, or `fit`'s."""
    config = resolved.engine
    if config.n_ctx is not None:
        by = resolved.sources.get("n_ctx", "flag")
        reason = f"n_ctx {config.n_ctx:,} as set by {'--n-ctx' if by == 'flag' else by}"
        n_ctx = config.n_ctx
    elif fit is not None and slots:
        reason, n_ctx = fit[1], fit[0] * slots
    else:
        reason = (f"n_ctx auto: {DEFAULT_CTX_PER_SLOT:,} tokens a slot (the run sizes the context from "
                  + ("a file INPUT only)" if not file_input else "INPUT only in this process, not on Ray workers)"))
        n_ctx = DEFAULT_CTX_PER_SLOT * slots if slots else None
    return {"n_parallel": slots, "slot_ctx": ctx, "n_ctx": n_ctx, "kv_unified": bool(config.kv_unified),
            "context_reason": reason}


class _Pending:
    """n_ctx auto: what the lines need (prompt tokens + max_tokens, once per sample: each
    holds a slot, as context_fit counts), as a histogram, and the lines that wait for the
    plan: those needing more than a default slot, as (line number, prompt tokens, max_tokens,
    n, prefix reuse counted for it)."""

    def __init__(self, slot: int = DEFAULT_CTX_PER_SLOT) -> None:
        self.slot = slot  # what an unplanned slot holds: a line needing more waits for the plan
        self.needs: Counter = Counter()
        self.lines: list[tuple[int, int, int, int, int]] = []

    def planned_needs(self, n_parallel: int) -> list[int]:
        """The needs plan_context decides the same on as on all of them, in memory flat in
        the lines: every need over a default slot (the ones that size it, or can never fit),
        and of the others only the `n_parallel` largest (a plan's slots share them at most;
        they are never too long where a plan is made)."""
        long = [need for need in self.needs.elements() if need > DEFAULT_CTX_PER_SLOT]
        short: list[int] = []
        for need in sorted((n for n in self.needs if n <= DEFAULT_CTX_PER_SLOT), reverse=True):
            short += [need] * min(self.needs[need], n_parallel - len(short))
            if len(short) >= n_parallel:
                break
        return long + short


class _Scan:
    """Every line parsed and tokenized, and counted; `ctx`: the tokens a slot holds when they
    are known before the first line (n_ctx set, or auto where the run does not size it), else
    `pending` collects for the plan and `settle` finishes."""

    def __init__(self, source: Any, side: _OutputSide | None, retry_failed: bool, ctx: int | None,
                 slots: int | None, reuse_on: bool, pending: _Pending | None, trained: int | None = None,
                 pool: bool = False):
        self.source, self.side, self.retry_failed, self.ctx, self.pending = source, side, retry_failed, ctx, pending
        self.trained = trained  # the model's trained context (None: unknown), for an overflow's words
        self.pool = pool  # one request's room is from a pool the slots share (kv_unified)
        self.seen = IdSet()
        self.lengths = LengthStats()
        self.reuse = PrefixReuse(slots or RECENT, enabled=reuse_on)
        self.codes: Counter = Counter()
        self.errors: list[tuple[int, str]] = []  # (line number, message): the first ones
        self.total = self.valid = self.answered = self.retried = self.output_tokens = 0
        self.lines: list[tuple[str, int]] = []  # the first lines' prompts and max_tokens, for the KV layout a run would choose

    def read(self, engine: Any, parser: LineParser) -> None:
        for line_no, raw in self.source.lines():
            item = parser.parse(raw, line_no)
            if item is not None:
                self._line(engine, line_no, item)

    def _line(self, engine: Any, line_no: int, item: Any) -> None:
        side, ctx = self.side, self.ctx
        self.total += 1
        if isinstance(item, LineRequest) and item.embed is None:
            note_line(self.lines, item.prompt, item.params.max_tokens)
        first_use = self.seen.add(item.id)
        if side is not None:
            if self.retry_failed and first_use and item.id in side.retryable:
                self.retried += 1
            elif side.answered.covers(item.id, first_use):
                self.answered += 1
                return
        if not first_use:
            item = duplicate_id_error(item)
        if not isinstance(item, LineError):
            try:
                embed = item.embed is not None
                tokens = _embed_tokens(engine, item.embed.inputs) if embed else _prompt_tokens(engine, item.prompt)
                if not tokens:
                    raise LlamaBatchError("prompt is empty")
                if ctx is not None and len(tokens) >= ctx and not embed:
                    item = LineError(line_no, item.id, "context_overflow", f"line {line_no}: " + prompt_overflow(
                        len(tokens), ctx, trained=self.trained, pool=self.pool))
            except LlamaBatchError as exc:
                item = LineError(line_no, item.id, exc.code, f"line {line_no}: {exc}")
            except Exception as exc:  # a template that fails on this line's messages: this line's error
                item = LineError(line_no, item.id, "invalid_request", f"line {line_no}: {type(exc).__name__}: {exc}")
        if isinstance(item, LineError):
            message = (item.message if item.message.startswith(("line ", "row "))
                       else f"{getattr(self.source, 'unit', 'line')} {line_no}: {item.message}")
            self._error(line_no, item.code, message)
            return
        n = max(1, item.params.n)
        if self.pending is not None and item.embed is None:
            need = len(tokens) + item.params.max_tokens
            self.pending.needs[need] += n
            if need > self.pending.slot:  # no plan gives one request less than an unplanned slot
                gain = self.reuse.add(tokens)
                self.pending.lines.append((line_no, len(tokens), item.params.max_tokens, n, gain))
                return
        self.valid += 1
        self.lengths.add(len(tokens))
        if item.embed is not None:
            return  # embeddings generate nothing and share no prefix cache
        self.reuse.add(tokens)
        want = item.params.max_tokens * n
        if ctx is not None:
            want = min(want, (ctx - len(tokens)) * n)
        self.output_tokens += want

    def _error(self, line_no: int, code: str, message: str) -> None:
        self.codes[code] += 1
        if len(self.errors) < SHOWN_ERRORS:
            self.errors.append((line_no, f"{code}: {message}"))

    def settle(self, room: int, bounds: AutoBounds) -> int:
        """The waiting lines, where one request may hold `room` tokens: a prompt of `room` or
        more can never fit, the others run with max_tokens clipped by their room. Returns the
        lines that can never fit."""
        assert self.pending is not None
        never, shown = 0, []
        for line_no, prompt, max_tokens, n, gain in self.pending.lines:
            if prompt >= room:
                never += 1
                self.reuse.tokens -= gain
                if len(shown) < SHOWN_ERRORS:
                    shown.append((line_no, f"context_overflow: line {line_no}: "
                                           f"{bounds.never_fits(prompt, max_tokens, room)}"))
                continue
            self.valid += 1
            self.lengths.add(prompt)
            self.output_tokens += min(max_tokens, room - prompt) * n
        self.pending.lines = []
        if never:
            self.codes["context_overflow"] += never
        # the first errors read, and the first of these (lines in order): the first of all
        self.errors = sorted(self.errors + shown)[:SHOWN_ERRORS]
        return never

    def report(self) -> dict[str, Any]:
        invalid = sum(self.codes.values())
        report: dict[str, Any] = {
            "input": self.source.name, "lines": self.total, "to_run": self.valid + invalid,
            "valid": self.valid, "invalid": invalid, "invalid_by_code": dict(sorted(self.codes.items())),
            "first_errors": [message for _line_no, message in self.errors],
            "prompt_tokens": self.lengths.as_dict(), "prefix_reuse_tokens": self.reuse.tokens,
            "max_output_tokens": self.output_tokens,
        }
        if self.side is not None:
            foreign, shown = not_in_input(self.seen, *self.side.paths, shown=SHOWN_FOREIGN)
            report["resume"] = {"already_answered": self.answered, "retried": self.retried,
                                "records": self.side.answered.records, "not_in_input": foreign,
                                "not_in_input_ids": shown}
        return report
