"""Tables in: CSV, TSV, Parquet, Arrow/Feather and Hugging Face datasets from the local hub
cache, turned into prompts by a str.format template (docs/tables.md).

    from llamabatch.tables import read_rows
    for row in read_rows("reviews.parquet", template="Classify the sentiment: {review}"):
        row.id, row.prompt, row.error

Nothing here needs the CLI or a model; Parquet, Arrow and hf: inputs need pyarrow
(`pip install 'llamabatch[tables]'`).
"""
from __future__ import annotations

from .errors import MissingExtra, RowProblem, TableError
from .open_table import TABLE_EXTENSIONS, is_table_input, open_table
from .rows import Row, RowReader, open_rows, read_rows
from .template import PromptTemplate, load_messages_template, load_template_file

__all__ = ["read_rows", "open_rows", "Row", "RowReader", "PromptTemplate", "TableError", "MissingExtra",
           "RowProblem", "open_table", "is_table_input", "TABLE_EXTENSIONS", "load_messages_template",
           "load_template_file"]
