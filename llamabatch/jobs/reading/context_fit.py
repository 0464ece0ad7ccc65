"""`run` with `n_ctx` auto: read INPUT once before the engine opens, find what its longest
lines need (prompt tokens + max_tokens), and size the KV cache from that
(settings/context_sizing.py has the rule).

Reading must cost little on the usual file of short lines, so a line is tokenized only when
a bound on its tokens says it might need more than a default slot: a text of B bytes is at
most B tokens (+ BOS), a chat at most its contents' bytes plus CHAT_ALLOWANCE for what a
template adds. Only then is a tokenizer opened (an in-process engine with one small slot, as
the dry run's: the model's own template and vocabulary), and only those lines go through it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from ...config import DEFAULT_CTX_PER_SLOT
from ...errors import LlamaBatchError
from ...settings.context_sizing import DEFAULT_SLOT_REASON, ContextPlan, plan_context
from ...settings.kv_layout import layout_for, note_line
from ...settings.resolved import Resolved
from ...openai_format import LineRequest

CHAT_ALLOWANCE = 512  # tokens a chat template may add around the messages (a default system prompt)
PER_MESSAGE = 16  # and around each message
TOKENIZER_CTX = 512  # the tokenizer's one slot: tokenizing needs no context


def token_bound(item: LineRequest) -> int | None:
    """At most this many tokens for the line's prompt; None when no bound is cheap."""
    prompt = item.prompt
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "surrogatepass")) + 2
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        size = 0
        for message in prompt:
            content = message.get("content")
            size += len(str(content).encode("utf-8", "surrogatepass")) if content is not None else 0
            size += PER_MESSAGE + sum(len(str(v)) for k, v in message.items() if k not in ("content",))
        return size + CHAT_ALLOWANCE
    return None


def maybe_long(items: Iterable[Any]) -> tuple[list[int], list[LineRequest]]:
    """(a bound on the need of each line that surely fits a default slot, the lines whose
    need might pass one)."""
    short, candidates = [], []
    for item in items:
        if not isinstance(item, LineRequest) or item.embed is not None:
            continue  # an error line runs nothing; embeddings have a context of their own
        bound = token_bound(item)
        n = max(1, item.params.n)
        if bound is None or bound + item.params.max_tokens > DEFAULT_CTX_PER_SLOT:
            candidates.append(item)
        else:
            short.extend([bound + item.params.max_tokens] * n)  # each sample holds a slot
    return short, candidates


def line_needs(engine: Any, candidates: list[LineRequest]) -> tuple[list[int], set[int]]:
    """Prompt tokens + max_tokens of each candidate (each sample), as `engine` tokenizes it,
    and the numbers of the lines that need more than a default slot; a line it cannot
    tokenize is left out (it fails on its own when it runs)."""
    needs, long = [], set()
    for item in candidates:
        try:
            if isinstance(item.prompt, str):
                tokens = engine.tokenize(item.prompt, special=False)
            elif item.prompt and isinstance(item.prompt[0], dict):
                tokens = engine.tokenize(engine.render_chat(item.prompt), special=True)
            else:
                tokens = list(item.prompt)
        except (LlamaBatchError, ValueError, TypeError, KeyError):
            continue
        need = len(tokens) + item.params.max_tokens
        needs.extend([need] * max(1, item.params.n))
        if need > DEFAULT_CTX_PER_SLOT:
            long.add(item.line_no)
    return needs, long


def parsed_lines(path: str, parser: Any) -> Iterable[Any]:
    """INPUT's lines parsed as the run will parse them, read from the file again."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not text.strip():
                continue
            try:
                yield parser.parse(text, line_no)
            except Exception:  # noqa: BLE001 - the run itself reports a line it cannot read
                continue


def fit_context(resolved: Resolved, path: str, parser: Any, *, prepare: Callable[[Resolved, int], Resolved],
                open_tokenizer: Callable[[Resolved], Any], model_facts: Callable[[Resolved], tuple],
                ) -> tuple[Resolved, ContextPlan | None, frozenset[int]]:
    """`resolved` with n_ctx, n_parallel and kv_unified sized for the lines of `path`, the
    plan (None: every line fits a default slot, or n_ctx was given: nothing changes), and the
    numbers of the lines longer than a default slot, which the run starts last
    (start_order.py says why).
    `prepare(resolved, lines)` resolves the model and n_parallel (auto bounded by the lines),
    leaving the memory fit of unplanned slots to the engine's opening (settings/ready.py:
    it replaces DEFAULT_SLOT_REASON with its own);
    `model_facts(resolved)` -> (trained context, KV bytes a cell takes, KV bytes allowed, what
    allows them: settings/context_sizing.model_facts)."""
    if resolved.engine.n_ctx is not None:
        return resolved, None, frozenset()
    lines: list[tuple[str, int]] = []  # the first lines' prompts and max_tokens, for the KV layout (settings/kv_layout.py)
    short, candidates = maybe_long(_noting_lines(parsed_lines(path, parser), lines))
    if not candidates:
        return with_reason(_with_layout(resolved, lines), DEFAULT_SLOT_REASON), None, frozenset()
    slots_fixed = resolved.engine.n_parallel != "auto"
    resolved = prepare(resolved, len(short) + len(candidates))
    tokenizer = open_tokenizer(dataclasses.replace(resolved, engine=resolved.engine.replace(
        n_parallel=1, n_ctx=TOKENIZER_CTX, kv_unified=False, prefix_store=None)))
    try:
        needs, long = line_needs(tokenizer, candidates)
    finally:
        tokenizer.close()
    model_ctx, per_token, budget, budget_text = model_facts(resolved)
    plan = plan_context(needs + short, int(resolved.engine.n_parallel), model_ctx, per_token, budget, budget_text,
                        pool_allowed=not resolved.engine.deterministic, slots_fixed=slots_fixed)
    if plan is None:
        return with_reason(_with_layout(resolved, lines), DEFAULT_SLOT_REASON), None, frozenset()
    engine = resolved.engine.replace(n_parallel=plan.n_parallel, n_ctx=plan.n_ctx, kv_unified=plan.kv_unified)
    reason = plan.reason + ("; lines longer than 4,096 tokens start after the others" if long and len(long) < len(needs + short) else "")
    return with_reason(resolved.replace(engine=engine.validate()), reason), plan, frozenset(long)


def _noting_lines(items: Iterable[Any], lines: list[tuple[str, int]]) -> Iterable[Any]:
    for item in items:
        if isinstance(item, LineRequest) and item.embed is None:
            note_line(lines, item.prompt, item.params.max_tokens)
        yield item


def _with_layout(resolved: Resolved, lines: list[tuple[str, int]]) -> Resolved:
    """The KV layout chosen from the lines' prompts and answers, unless the user chose one (or deterministic
    mode, whose rows need a stream per sequence, rules it); the header says why."""
    choice = layout_for(resolved, lines)
    if choice is None:
        return resolved
    unified, reason = choice
    return resolved.replace(engine=resolved.engine.replace(kv_unified=unified).validate(), layout_reason=reason)


def with_reason(resolved: Resolved, reason: str) -> Resolved:
    """The header's "why" for the slots gains the context's."""
    return resolved.replace(slots_reason="; ".join(r for r in (resolved.slots_reason, reason) if r))
