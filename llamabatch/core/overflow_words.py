"""The one wording of "this prompt is too long" (ContextOverflow), and what would help.

Every front end that runs a prompt (run, serve-stdin, serve, the library) gets it from the
engine (core/inputs.py), and `run --dry-run` from the estimate (jobs/estimates/), so a line
is refused in the same words before and during a run.

The advice is what can help: a prompt at least as long as the model's trained context can
only be shortened (a larger --n-ctx gives a slot more, past what the model was trained on,
where its output may degrade); a shorter one fits with a larger --n-ctx or, where each slot
has a stream of its own, with --kv-unified (one request may take up to the model's context
from the pool the slots share).
"""
from __future__ import annotations

from typing import Any, Mapping

PAST_TRAINING_HELPS = ("shorten the prompt, or give --n-ctx (n_ctx / n_parallel tokens a slot; past the model's "
                       "trained context its output may degrade)")


def trained_context(metadata: Mapping[str, Any] | None) -> int | None:
    """The model's trained context from its metadata (the GGUF header's integer, or llama.cpp's
    metadata API's string); None when it does not say."""
    if not metadata:
        return None
    try:
        value = int(metadata.get(f"{metadata.get('general.architecture')}.context_length") or 0)
    except (TypeError, ValueError):
        return None
    return value or None


def past_training(prompt_tokens: int, trained: int | None) -> str | None:
    """The words for a prompt that leaves no room for an answer within the model's trained
    context (None: it does, or the context is unknown)."""
    if not trained or prompt_tokens < trained:
        return None
    return (f"prompt has {prompt_tokens:,} tokens but the model's trained context is {trained:,} tokens, "
            f"prompt and answer together: {PAST_TRAINING_HELPS}")


def prompt_overflow(prompt_tokens: int, room: int, *, trained: int | None, pool: bool) -> str:
    """Why a prompt of `prompt_tokens` tokens cannot run where one request may hold `room`
    tokens (`pool`: from the pool the slots share, kv_unified; else a stream a slot), and what
    would help. `trained`: the model's trained context (None: unknown)."""
    beyond = past_training(prompt_tokens, trained)
    if beyond:
        return beyond
    if pool:
        holds = (f"one request may hold at most {room:,} (the model's trained context or the shared pool, "
                 "whichever is less)")
        helps = "a larger --n-ctx helps, up to the model's trained context" + (f" of {trained:,}" if trained else "")
    else:
        holds = f"a slot holds {room:,} (n_ctx / n_parallel)"
        helps = ("raise --n-ctx, or --kv-unified lets one request take up to the model's context from a pool the "
                 "slots share (`run` sizes this from its file with --n-ctx auto, the default)")
    return f"prompt has {prompt_tokens:,} tokens but {holds}, and at least one must be left for the answer; {helps}"


def bytes_overflow(size: int, room: int, longest_token: int, *, trained: int | None) -> str:
    """Why a text of `size` bytes is refused untokenized: more than `room` tokens of at most
    `longest_token` bytes each could spell (core/byte_bound.py), and what would help."""
    said = (f"prompt has {size:,} bytes, more than a slot's {room:,} tokens can hold (at most {longest_token} bytes "
            "a token in this vocabulary)")
    if trained and size > trained * longest_token:  # surely past the trained context too
        return f"{said}, and more than the model's trained context of {trained:,} tokens: {PAST_TRAINING_HELPS}"
    # its tokens are not counted (that is what the bound spares), so whether it is past the
    # trained context too is not known: both ways out, with the model's figure
    return f"{said}: shorten the prompt, or raise --n-ctx" + (f" (up to the model's trained context of {trained:,})"
                                                              if trained else "")
