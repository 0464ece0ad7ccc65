"""Log probabilities in the shapes users already parse: OpenAI chat, OpenAI (legacy) completions.

The engine gives one record per generated token (see llamabatch/llama/sampling/logprobs.py):
`{"token", "id", "logprob", "bytes", "top_logprobs": [{"token", "id", "logprob", "bytes"}]}`.
These functions only reshape those records; pure, so every rule is unit-testable.
"""
from __future__ import annotations

from typing import Any

Record = dict[str, Any]


def covering(records: list[Record] | None, text: str) -> list[Record]:
    """The records of the tokens that make up `text`.

    A stop string is cut from the text but its tokens were generated (and have logprobs):
    keep only the tokens that start inside the returned text, so the token strings join to
    it (OpenAI's shape promises that).
    """
    out: list[Record] = []
    offset = 0
    for rec in records or []:
        if offset >= len(text):
            break
        out.append(rec)
        offset += len(rec["token"])
    return out


def chat_logprobs(records: list[Record] | None, text: str) -> dict[str, Any]:
    """`choices[i].logprobs` of a chat.completion: `{"content": [...], "refusal": null}`."""
    content = [{"token": r["token"], "logprob": r["logprob"], "bytes": r["bytes"],
                "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                 for t in r.get("top_logprobs", [])]}
               for r in covering(records, text)]
    return {"content": content, "refusal": None}


def completion_logprobs(records: list[Record] | None, text: str) -> dict[str, Any]:
    """`choices[i].logprobs` of a text_completion: parallel lists, offsets into the generated text
    (vLLM's convention when the prompt is not echoed)."""
    kept = covering(records, text)
    offsets, offset = [], 0
    for r in kept:
        offsets.append(offset)
        offset += len(r["token"])
    top: list[dict[str, float]] = []
    for r in kept:
        # OpenAI's legacy shape maps token string -> logprob; two ids that print the same keep
        # the likelier one (the list is sorted, so the first).
        alternatives: dict[str, float] = {}
        for t in r.get("top_logprobs", []):
            alternatives.setdefault(t["token"], t["logprob"])
        top.append(alternatives)
    return {"tokens": [r["token"] for r in kept], "token_logprobs": [r["logprob"] for r in kept],
            "top_logprobs": top, "text_offset": offsets}

