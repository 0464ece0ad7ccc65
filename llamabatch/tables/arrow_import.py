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
