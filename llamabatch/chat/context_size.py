"""`chat` with `n_ctx` auto: a conversation may grow to the model's trained context, not to a
fixed 4,096 tokens, where the KV memory allowed holds that much for every slot.

A chat cannot know its work first (`run` reads its file: settings/context_sizing.py), so each
slot is given what one conversation may ever use: the model's trained context
(`request_limit`: never less than the 4,096 a slot held before), no more than the KV memory
allowed holds for the slots (`model_facts`: half of the memory available, or what
`max_memory` leaves beside the weights; and never more than the default max_memory leaves
beside them, which the engine checks before the context is created). A model whose header
cannot be read (a test's fake engine) keeps today's 4,096, as does a size the engine's memory
check would still refuse (a deterministic chat's spare sequences); where max_memory does not
hold even 4,096 a slot, each slot gets what it holds (settings/ready.fit_in_memory, as
for every engine). An explicit n_ctx is kept.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..config import DEFAULT_CTX_PER_SLOT, EngineConfig
from ..settings.ready import fit_in_memory, prepare
from ..errors import ResourceLimit
from ..settings.context_sizing import GRAIN, request_limit
from ..settings.resolved import Resolved

# (trained context, KV bytes a cell takes, KV bytes allowed, what allows them): context_sizing.model_facts
Facts = tuple[Optional[int], Optional[int], Optional[int], str]


def slot_tokens(model_ctx: int | None, per_token: int | None, kv_budget: int | None, n_parallel: int,
                budget_text: str = "the KV memory allowed") -> tuple[int | None, str]:
    """Tokens each of `n_parallel` slots gets, and why in a few words (for the start line);
    (None, "") when the model's context is not known: today's 4,096 stays."""
    if not model_ctx:
        return None, ""
    limit = request_limit(model_ctx)
    held = None  # tokens a slot the KV memory allowed holds (None: not judged)
    if per_token and kv_budget is not None:
        held = kv_budget // per_token // max(1, n_parallel) // GRAIN * GRAIN
    if held is None or held >= limit:
        if limit > model_ctx:
            return limit, f"n_ctx auto; the model was trained for {model_ctx:,}"
        return limit, "the model's, n_ctx auto"
    if held <= DEFAULT_CTX_PER_SLOT:
        return DEFAULT_CTX_PER_SLOT, f"n_ctx auto: {budget_text} holds no more; the model's is {model_ctx:,}"
    return held, f"n_ctx auto: what {budget_text} holds; the model's is {model_ctx:,}"


def chat_context(resolved: Resolved, factory: Any = None, *,
                 facts: Callable[[EngineConfig, str], Facts] | None = None) -> tuple[Resolved, str]:
    """`resolved` with n_ctx sized for a chat (see the module docstring), and why in a few
    words ("" when nothing was decided: n_ctx given, or the model's context unknown).
    The model is resolved and checked first, and n_parallel "auto" decided (settings.ready,
    with `factory`'s slot chooser); opening the engine afterwards repeats none of it."""
    if resolved.engine.n_ctx is not None:
        return resolved, ""
    resolved = (prepare(resolved, None, factory.choose_slots, fit_memory=False) if factory is not None
                else prepare(resolved, fit_memory=False))
    config, path = resolved.engine, resolved.engine.model
    model_ctx, per_token, budget, budget_text = (facts or _model_facts)(config, path)
    slots = int(config.n_parallel)
    per_slot, why = slot_tokens(model_ctx, per_token, budget, slots, budget_text)
    if per_slot is None or per_slot <= DEFAULT_CTX_PER_SLOT:
        # max_memory may not hold even a default slot each: the rule every engine follows
        fitted = fit_in_memory(resolved)
        if fitted is not None:
            return fitted
    if per_slot is None:
        return resolved, ""
    sized = config.replace(n_ctx=per_slot * slots).validate()
    if per_slot > DEFAULT_CTX_PER_SLOT and not _fits(sized, path):
        return resolved, ""  # the engine's own check would refuse it: today's 4,096, and its words if that fails too
    return resolved.replace(engine=sized), why


def context_words(slot_ctx: int, why: str = "") -> str:
    """The start line's words for the context: "32,768-token context (the model's, n_ctx auto)"."""
    return f"{slot_ctx:,}-token context" + (f" ({why})" if why else "")


def _model_facts(config: EngineConfig, model_path: str) -> Facts:
    """context_sizing.model_facts, its budget no larger than the default max_memory (90% of
    what is available) leaves beside the weights: what the engine checks before loading."""
    from ..settings.context_sizing import model_facts
    from ..kernel_paths.resources import available_memory, weights_size
    from ..checks.max_memory import memory_cap

    model_ctx, per_token, budget, text = model_facts(config, model_path)
    if budget is not None and config.max_memory is None:
        memory = available_memory()
        cap = memory_cap(None, memory) if memory else None
        if cap is not None and cap - weights_size(model_path) < budget:
            budget, text = max(0, cap - weights_size(model_path)), "the default max_memory less the weights"
    return model_ctx, per_token, budget, text


def _fits(config: EngineConfig, model_path: str) -> bool:
    """False when the engine's memory check (kernel_paths/resources.py) would refuse `config`: a
    deterministic chat's spare sequences take more KV than its slots alone."""
    from ..kernel_paths.resources import check

    try:
        check(config, model_path)
    except ResourceLimit:
        return False
    return True
