"""The KV layout `run` chooses from its file, when neither --kv-unified nor --no-kv-unified is
given: one cache shared by the slots, or a stream per slot.

What decides is how long each line's own part of its prompt is, once what it shares with other
lines (an instruction, examples, a system turn) is taken away: the shared part is evaluated once
and forked either way, and a line's own part is what its prefill ticks evaluate. With one shared
cache every tick is one graph run, but every row attends over every slot's cells; with a stream
per slot a tick that mixes a prefill chunk with decode rows is several graph runs, each row
attending over its own stream only. Short own parts: the shared cache wins (fewer graph runs,
little attention); long ones: streams win (docs/performance.md, "The KV layout chosen from the
work", has the measurement behind OWN_PART_BYTES).
"""
from __future__ import annotations

import json
import statistics
from typing import Any, Sequence

OWN_PART_BYTES = 1024  # a line's own part (about 256 tokens) from which a stream per slot pays
SAMPLE_LINES = 4096  # the lines read for the choice: the first this many of INPUT


def prompt_text(prompt: Any) -> str:
    """A line's prompt as text for comparing with others: the text, or a chat's or token ids'
    JSON (a shared system turn or token prefix is then a shared text prefix)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)


def own_parts(texts: Sequence[str]) -> list[int]:
    """Each text's length beyond the longest prefix it shares with another text."""
    order = sorted(range(len(texts)), key=texts.__getitem__)
    shared = [0] * len(texts)
    for a, b in zip(order, order[1:]):  # the longest common prefix is with a neighbour in sorted order
        n = _common(texts[a], texts[b])
        shared[a], shared[b] = max(shared[a], n), max(shared[b], n)
    return [len(text.encode("utf-8", "surrogatepass")) - len(text[:n].encode("utf-8", "surrogatepass"))
            for text, n in zip(texts, shared)]


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def layout_for(resolved: Any, texts: Sequence[str]) -> tuple[bool, str] | None:
    """choose_layout for a run's settings: None where the user chose a layout (flag, env or
    config file) or deterministic mode rules the shared cache out."""
    if resolved.sources.get("kv_unified", "default") != "default" or resolved.engine.deterministic:
        return None
    return choose_layout(texts)


def choose_layout(texts: Sequence[str]) -> tuple[bool, str] | None:
    """(kv_unified, the run header's sentence) for lines with these prompts; None without lines."""
    if not texts:
        return None
    median = int(statistics.median(own_parts(texts)))
    if median < OWN_PART_BYTES:
        return True, (f"KV layout: one cache shared by the slots, as the lines' own prompt parts are short "
                      f"(median {median:,} bytes beside what they share; a stream per slot pays from "
                      f"{OWN_PART_BYTES:,})")
    return False, (f"KV layout: a stream per slot, as the lines' own prompt parts are long (median {median:,} "
                   f"bytes beside what they share; one shared cache pays below {OWN_PART_BYTES:,})")
