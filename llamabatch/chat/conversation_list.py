"""`llamabatch chat --list` and `--search TEXT`: the saved conversations, newest first.

    ID  WHEN              MODEL                MSGS  FIRST LINE
    2   2026-11-29 17:05  gemma-3-270m-q4_k_m     2  summarise this

One conversation a line on stdout (data), so `| head` and `| grep` work; "nothing saved"
goes to stderr. --search shows the matching text instead of the first line.
"""
from __future__ import annotations

import time
from typing import Callable

from .store import Store, Summary


def rows(summaries: list[Summary], last_column: str) -> list[str]:
    id_width = max([len("ID")] + [len(str(s.id)) for s in summaries])
    model_width = max([len("MODEL")] + [len(s.model) for s in summaries])
    lines = [f"{'ID':<{id_width}}  {'WHEN':<16}  {'MODEL':<{model_width}}  MSGS  {last_column}"]
    for s in summaries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated))
        lines.append(f"{s.id:<{id_width}}  {when}  {s.model:<{model_width}}  {s.messages:>4}  {s.first_line}")
    return lines


def print_list(store: Store, search: str | None, out: Callable[[str], None], note: Callable[[str], None]) -> None:
    found = store.search(search) if search is not None else store.list()
    if not found:
        note(f"no saved conversation matches {search!r}" if search is not None else
             f"no saved conversations yet ({store.path})")
        return
    for line in rows(found, "MATCH" if search is not None else "FIRST LINE"):
        out(line)
