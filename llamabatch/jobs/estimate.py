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
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any, Callable

from ..errors import InvalidRequest, LlamaBatchError
from ..settings.resolved import Resolved
from ..settings.slots import planned_slots
from .estimate_arithmetic import LengthStats, PrefixReuse, RECENT, eta, slot_ctx
from .input_source import count_nonblank, open_input
from .output_sink import stream_kind
from .line_shapes import LineError, LineParser, duplicate_id_error, is_unnamed_error, record_id
from .id_sets import Answered, IdSet
from .retry_journal import is_retryable, journal_path, whole_records
from .manifest_fields import not_in_input

SHOWN_ERRORS = 5
SHOWN_FOREIGN = 5
TOKENIZER_CTX = 512  # the dry run's one slot: tokenizing needs no context


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
    from ..core.embedding import split_inputs

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

def estimate_lines(resolved: Resolved, parser: LineParser, input_path: str, output: str | None, *,
                   resume: bool, retry_failed: bool, error_file: str | None, stdin: Any,
                   open_tokenizer: Callable[[Resolved], Any], table_source: Any = None,
                   table_rows: int | None = None) -> dict[str, Any]:
    """The estimate as a JSON-ready dict (what `run --dry-run --json` prints).
    `open_tokenizer(resolved)` builds an in-process engine. A table INPUT comes opened
    (`table_source`, table_input.TableSource, with `table_rows` when its row count is known)
    and `parser` is its TableParser; `output` is then the records file. Raises InvalidRequest
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
    ctx = slot_ctx(config, slots)
    tokenizer = resolved.engine.replace(n_parallel=1, n_ctx=TOKENIZER_CTX)
    engine = open_tokenizer(dataclasses.replace(resolved, engine=tokenizer))
    try:
        report = _scan(engine, parser, source, side, retry_failed, ctx, slots,
                       config.cache_prompt and not config.deterministic)
    finally:
        engine.close()
        source.close()
    report["slots"] = {"n_parallel": slots, "slot_ctx": ctx,
                       "source": "--n-parallel" if config.n_parallel != "auto" else
                       ("auto calibration" if slots else "auto, not calibrated here")}
    to_evaluate = report["prompt_tokens"]["total"] - report["prefix_reuse_tokens"]
    report["eta"] = eta(slots, measured, at, report["max_output_tokens"], to_evaluate).as_dict()
    if resume:
        journal = journal_path(output)
        report["resume"]["pending_retry_merge"] = os.path.exists(journal)
    return report


def _scan(engine: Any, parser: LineParser, source, side: _OutputSide | None, retry_failed: bool,
          ctx: int | None, slots: int | None, reuse_on: bool) -> dict[str, Any]:
    seen = IdSet()
    lengths = LengthStats()
    reuse = PrefixReuse(slots or RECENT, enabled=reuse_on)
    codes: Counter = Counter()
    errors: list[str] = []
    total = valid = answered = retried = output_tokens = 0
    for line_no, raw in source.lines():
        item = parser.parse(raw, line_no)
        if item is None:
            continue
        total += 1
        first_use = seen.add(item.id)
        if side is not None:
            if retry_failed and first_use and item.id in side.retryable:
                retried += 1
            elif side.answered.covers(item.id, first_use):
                answered += 1
                continue
        if not first_use:
            item = duplicate_id_error(item)
        if not isinstance(item, LineError):
            try:
                embed = item.embed is not None
                tokens = _embed_tokens(engine, item.embed.inputs) if embed else _prompt_tokens(engine, item.prompt)
                if not tokens:
                    raise LlamaBatchError("prompt is empty")
                if ctx is not None and len(tokens) >= ctx and not embed:
                    item = LineError(line_no, item.id, "context_overflow",
                                     f"line {line_no}: prompt has {len(tokens)} tokens but a slot holds {ctx}")
            except LlamaBatchError as exc:
                item = LineError(line_no, item.id, exc.code, f"line {line_no}: {exc}")
            except Exception as exc:  # a template that fails on this line's messages: this line's error
                item = LineError(line_no, item.id, "invalid_request", f"line {line_no}: {type(exc).__name__}: {exc}")
        if isinstance(item, LineError):
            codes[item.code] += 1
            if len(errors) < SHOWN_ERRORS:
                message = (item.message if item.message.startswith(("line ", "row "))
                           else f"{getattr(source, 'unit', 'line')} {line_no}: {item.message}")
                errors.append(f"{item.code}: {message}")
            continue
        valid += 1
        lengths.add(len(tokens))
        if item.embed is not None:
            continue  # embeddings generate nothing and share no prefix cache
        reuse.add(tokens)
        want = item.params.max_tokens * max(1, item.params.n)
        if ctx is not None:
            want = min(want, (ctx - len(tokens)) * max(1, item.params.n))
        output_tokens += want
    report: dict[str, Any] = {
        "input": source.name, "lines": total, "to_run": valid + sum(codes.values()),
        "valid": valid, "invalid": sum(codes.values()), "invalid_by_code": dict(sorted(codes.items())),
        "first_errors": errors, "prompt_tokens": lengths.as_dict(), "prefix_reuse_tokens": reuse.tokens,
        "max_output_tokens": output_tokens,
    }
    if side is not None:
        foreign, shown = not_in_input(seen, *side.paths, shown=SHOWN_FOREIGN)
        report["resume"] = {"already_answered": answered, "retried": retried, "records": side.answered.records,
                            "not_in_input": foreign, "not_in_input_ids": shown}
    return report
