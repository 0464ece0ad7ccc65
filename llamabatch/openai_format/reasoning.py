"""A thinking answer's reasoning in OpenAI-compatible shapes (as vLLM, llama-server and DeepSeek's
API give it): `message.reasoning_content` beside `content`, `delta.reasoning_content` in a stream,
and `usage.completion_tokens_details.reasoning_tokens`. The engine has split the answer already
(Result.reasoning, core/thinking.py); a request whose prompt marks no reasoning gets none of them.
"""
from __future__ import annotations

from typing import Any


def with_reasoning(message: dict[str, Any], sample: Any) -> dict[str, Any]:
    """The assistant message with the sample's reasoning (null where the block was empty); a
    content left empty by the reasoning (a block never closed) is null, as OpenAI's is."""
    if getattr(sample, "reasoning", None) is None:
        return message
    out = {**message, "reasoning_content": sample.reasoning or None}
    if out.get("content") == "" and not out.get("tool_calls"):
        out["content"] = None
    return out


def usage_details(usage: Any) -> dict[str, int] | None:
    """OpenAI's usage.completion_tokens_details where there is something to say: verified guesses
    (docs/speculative.md) or a thinking answer's reasoning tokens."""
    if usage.guessed or usage.reasoning_tokens is not None:
        return usage.completion_details()
    return None
