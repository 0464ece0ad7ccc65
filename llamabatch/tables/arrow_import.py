"""pyarrow is an optional extra (`pip install 'llamabatch[tables]'`): imported only where a
Parquet, Arrow or Hugging Face input needs it, and its absence is one line naming the extra."""
from __future__ import annotations

from typing import Any

from .errors import MissingExtra


def pyarrow_modules(what: str) -> tuple[Any, Any, Any]:
    """(pyarrow, pyarrow.parquet, pyarrow.ipc), or MissingExtra naming `what` needs them."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise MissingExtra(what) from None
    return pyarrow, pyarrow.parquet, pyarrow.ipc


def use_system_allocator() -> None:
    """Make Arrow allocate with malloc for the rest of the process. Arrow's default pool in the
    Linux wheels (mimalloc) keeps the pages of each freed row group, so peak memory grew with
    the row-group size: reading 1M rows in one row group peaked 8 MB above 100k rows, against
    1 MB with the system allocator (benchmarks/tables_vs_jsonl.py). `run` calls this; a library
    user reading huge row groups can too (it is process-wide, so it is not done on import)."""
    pa, _pq, _ipc = pyarrow_modules("reading Parquet/Arrow")
    pa.set_memory_pool(pa.system_memory_pool())
