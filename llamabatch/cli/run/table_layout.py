"""The columns of a results table (docs/tables.md#outputs)."""
from __future__ import annotations

from dataclasses import dataclass

RESULT_COLUMNS = ("response", "finish_reason", "error_code", "error", "prompt_tokens", "completion_tokens")
KEPT_PREFIX = "input."


@dataclass(frozen=True)
class Layout:
    """Which columns the table has."""

    keep: tuple[str, ...] = ()  # kept input columns, in order
    logprobs: bool = False
    rows: bool = True  # a `row` column (table inputs; a JSONL input's records have no row number)

    def kept_name(self, column: str) -> str:
        fixed = ("row", "id", "logprobs") + RESULT_COLUMNS
        return KEPT_PREFIX + column if column in fixed else column

    @property
    def columns(self) -> list[str]:
        return ((["row"] if self.rows else []) + ["id"] + [self.kept_name(c) for c in self.keep]
                + list(RESULT_COLUMNS) + (["logprobs"] if self.logprobs else []))
