"""What every table reader yields: one row's cells, or why that row could not be read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from .errors import RowProblem


@dataclass
class RawRow:
    row: int  # 1-based position among the table's data rows: the default id, stable across runs
    cells: dict[str, Any] | None  # column -> value (a column absent from this row is absent here)
    problem: RowProblem | None = None  # set when the row could not be read (then `cells` is None)


class Table(Protocol):
    name: str  # how messages name the input
    columns: list[str]  # every column, in the table's order

    def rows(self, columns: list[str] | None = None) -> Iterator[RawRow]:
        """The rows in order; `columns`: only these are needed (readers that can skip the rest do)."""

    def count(self) -> int | None:
        """How many rows (may read the whole file: call it off the main path); None if unknown."""

    def close(self) -> None: ...
