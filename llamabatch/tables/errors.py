"""What can go wrong reading a table: for the whole file (one line before the run) or for one row
(that row's error record; the run goes on)."""
from __future__ import annotations


class TableError(Exception):
    """The table can't be used at all (no such file, no header, an unknown template field,
    a missing optional dependency): one line for the user, said before anything runs."""


class MissingExtra(TableError):
    """pyarrow is needed (Parquet, Arrow, Hugging Face datasets) and not installed."""

    def __init__(self, what: str):
        super().__init__(f"{what} needs pyarrow, which is not installed: pip install 'llamabatch[tables]'")


class RowProblem(Exception):
    """One row can't become a prompt: `code` and `message` go into that row's error record."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# Error codes of row records (docs/tables.md lists them)
INVALID_ROW = "invalid_row"  # a missing, null, non-text, oversized or badly encoded cell; a ragged CSV row
UNREADABLE = "unreadable_rows"  # a Parquet row group (or Arrow batch) that could not be read
