"""The settings `/set` changes, under llamabatch's names and Ollama's.

    /set temperature 0.2                    llamabatch's spelling (SamplingParams' field names)
    /set parameter num_predict 64           Ollama's (`ollama run`'s /set parameter)

Ollama's names: num_ctx, num_predict, temperature, top_k, top_p, min_p, repeat_penalty,
seed, stop. num_ctx is not a sampling setting: it caps the tokens the conversation may use
within the slot; a larger value than the slot needs a restart, and the answer says how.
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from ..errors import InvalidRequest
from ..params import SamplingParams

# Ollama's name -> SamplingParams field (the fields keep their own names too)
OLLAMA_NAMES = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                "min_p": "min_p", "repeat_penalty": "repeat_penalty", "seed": "seed", "stop": "stop"}
KINDS: dict[str, Any] = {"max_tokens": int, "temperature": float, "top_k": int, "top_p": float, "min_p": float,
                         "repeat_penalty": float, "seed": int, "stop": list}
NUM_CTX = "num_ctx"
NAMES = (NUM_CTX, *OLLAMA_NAMES, *(k for k in KINDS if k not in OLLAMA_NAMES))
MIN_NUM_CTX = 64


def field_for(name: str) -> str | None:
    """The SamplingParams field `name` sets (either spelling); None for num_ctx or an unknown name."""
    name = name.lower()
    return OLLAMA_NAMES.get(name) or (name if name in KINDS else None)


def apply(params: SamplingParams, name: str, value: str) -> tuple[SamplingParams, Any]:
    """`params` with `name` set from the text `value`; InvalidRequest (one line) when it is bad."""
    key = field_for(name)
    if key is None:
        raise InvalidRequest(f"unknown parameter {name!r}; one of {', '.join(NAMES)}")
    parsed = parse(key, value)
    return params.replace(**{key: parsed}).validate(), parsed


def parse(key: str, value: str) -> Any:
    kind = KINDS[key]
    if kind is list:  # /set parameter stop "<|end|>" "\n\n": every word is a stop string
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        return [w.replace("\\n", "\n").replace("\\t", "\t") for w in words]  # \n spells a newline, as in Ollama
    if key == "seed" and value.lower() in ("random", "none", "-1"):
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidRequest(f"{value!r} is not {'an integer' if kind is int else 'a number'}") from None


def parse_num_ctx(value: str, slot_ctx: int) -> int:
    """The context cap from `/set parameter num_ctx N`; InvalidRequest says what a larger one takes."""
    try:
        n = int(value)
    except ValueError:
        raise InvalidRequest(f"{value!r} is not an integer") from None
    if n > slot_ctx:
        raise InvalidRequest(f"{n} tokens is more than this chat's {slot_ctx}-token slot; that takes a restart: "
                             f"/bye, then `llamabatch chat -c --n-ctx {n}` continues this conversation")
    if n < MIN_NUM_CTX:
        raise InvalidRequest(f"must be at least {MIN_NUM_CTX}, got {n}")
    return n


def settings(params: SamplingParams) -> dict[str, Any]:
    """The settings worth recording with a conversation, under Ollama's names."""
    return {ollama: getattr(params, key) for ollama, key in OLLAMA_NAMES.items()}


def show(params: SamplingParams, num_ctx: int, verbose: bool) -> list[str]:
    """`/show parameters`: one setting a line, Ollama's names, as `ollama show --parameters` does."""
    values: dict[str, Any] = {NUM_CTX: num_ctx, **settings(params)}
    values["seed"] = "random" if params.seed is None else params.seed
    values["stop"] = " ".join(_quote(s) for s in params.stop) if params.stop else "(the template's only)"
    values["verbose"] = "on" if verbose else "off"
    return ["parameters:"] + [f"  {name:<16}{value}" for name, value in values.items()]


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
