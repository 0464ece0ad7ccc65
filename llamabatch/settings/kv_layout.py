"""The KV layout `run` chooses from its file, when neither --kv-unified nor --no-kv-unified is
given: one cache shared by the slots, or a stream per slot.

What decides is how many tokens each line holds of its own: its prompt beyond the longest prefix
it shares with another line (an instruction, examples, a system turn: evaluated once and forked
either way), plus the answer it may write (max_tokens). With one shared cache every tick is one
graph run, but every row attends over every slot's cells; with a stream per slot a tick that
mixes a prompt chunk with decode rows is several graph runs, each row attending over its own
stream only. Lines short of their own: the shared cache wins (fewer graph runs, little
attention); long ones: streams win (docs/performance.md, "The KV layout chosen from the work",
has the measurement behind OWN_TOKENS).
"""
from __future__ import annotations

import json
import statistics
from typing import Any, Sequence

OWN_TOKENS = 128  # a line's own tokens (own prompt part and max_tokens) from which a stream per slot pays
BYTES_PER_TOKEN = 4  # a prompt's bytes to tokens, before anything is tokenized
SAMPLE_LINES = 4096  # the lines read for the choice: the first this many of INPUT


def prompt_text(prompt: Any) -> str:
    """A line's prompt as text for comparing with others: the text, or a chat's or token ids'
    JSON (a shared system turn or token prefix is then a shared text prefix)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)


def note_line(lines: list[tuple[str, int]], prompt: Any, max_tokens: int) -> None:
    """Keep a line's (prompt text, max_tokens) for choose_layout: the first SAMPLE_LINES lines."""
    if len(lines) < SAMPLE_LINES:
        lines.append((prompt_text(prompt), max_tokens))


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


def own_tokens(lines: Sequence[tuple[str, int]]) -> list[int]:
    """Each (prompt text, max_tokens) line's own tokens: its own prompt part's bytes as tokens,
    plus the answer it may write."""
    parts = own_parts([text for text, _ in lines])
    return [-(-part // BYTES_PER_TOKEN) + answer for part, (_, answer) in zip(parts, lines)]


def layout_for(resolved: Any, lines: Sequence[tuple[str, int]]) -> tuple[bool, str] | None:
    """choose_layout for a run's settings: None where the user chose a layout (flag, env or
    config file) or deterministic mode rules the shared cache out."""
    if resolved.sources.get("kv_unified", "default") != "default" or resolved.engine.deterministic:
        return None
    return choose_layout(lines)


def choose_layout(lines: Sequence[tuple[str, int]]) -> tuple[bool, str] | None:
    """(kv_unified, the run header's sentence) for lines of these (prompt text, max_tokens);
    None without lines."""
    if not lines:
        return None
    median = int(statistics.median(own_tokens(lines)))
    why = (f"(median {median:,} tokens of their own: the prompt beyond what lines share, plus max_tokens; "
           f"a stream per slot pays from {OWN_TOKENS:,})")
    if median < OWN_TOKENS:
        return True, f"KV layout: one cache shared by the slots, as the lines are short {why}"
    return False, f"KV layout: a stream per slot, as the lines are long {why}"
