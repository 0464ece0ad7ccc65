"""The columns of a results table (docs/tables.md#outputs)."""
from __future__ import annotations

import string
from dataclasses import dataclass

RESULT_COLUMNS = ("response", "finish_reason", "error_code", "error", "prompt_tokens", "completion_tokens")
KEPT_PREFIX = "input."
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)  # SQLite folds ASCII only


@dataclass(frozen=True)
class Layout:
    """Which columns the table has."""

    keep: tuple[str, ...] = ()  # kept input columns, in order
    logprobs: bool = False
    rows: bool = True  # a `row` column (table inputs; a JSONL input's records have no row number)
    tool_calls: bool = False  # a `tool_calls` column: some answer made tool calls (table_output.finalize)
    reasoning: bool = False  # a `reasoning` column: some answer was a thinking model's (table_output.finalize)

    def kept_name(self, column: str) -> str:
        """A kept column's name in the table: prefixed when it is an output column's name in any
        case (SQLite tells no names apart by case: `ID` beside `id` would be refused there)."""
        fixed = ("row", "id", "logprobs", "tool_calls", "reasoning") + RESULT_COLUMNS
        return KEPT_PREFIX + column if column.translate(_ASCII_LOWER) in fixed else column

    def clashes(self, fold_case: bool = False) -> list[list[str]]:
        """Groups of kept columns that would get the same name in the table (`id` and `input.id`;
        with `fold_case`, `a` and `A`, as SQLite compares names), each in keep order."""
        groups: dict[str, list[str]] = {}
        for column in self.keep:
            name = self.kept_name(column)
            groups.setdefault(name.translate(_ASCII_LOWER) if fold_case else name, []).append(column)
        return [group for group in groups.values() if len(group) > 1]

    @property
    def columns(self) -> list[str]:
        return ((["row"] if self.rows else []) + ["id"] + [self.kept_name(c) for c in self.keep]
                + list(RESULT_COLUMNS) + (["logprobs"] if self.logprobs else [])
                + (["tool_calls"] if self.tool_calls else []) + (["reasoning"] if self.reasoning else []))
