"""Heavy third-party modules a few test files use, imported on first use instead of when pytest
collects the file: every xdist worker collects every test file, and these cost each worker
about a second at its start (openai 0.5 s, pandas 0.2 s, polars 0.15 s, pyarrow 0.1 s) whether
or not it runs a test that needs them.

    openai = lazy("openai")        # then openai.OpenAI(...), pytest.raises(openai.BadRequestError)
"""
from __future__ import annotations

import importlib
import types
from typing import Any


# What pytest's collection asks of every name at a test module's top level: answered without
# importing (no module defines them).
_COLLECTION_PROBES = {"__test__", "__bases__"}


class _LazyModule(types.ModuleType):
    """Stands for the module `name`: the first attribute asked for imports it."""

    def __getattr__(self, attr: str) -> Any:
        if attr in _COLLECTION_PROBES:
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


def lazy(name: str) -> Any:
    return _LazyModule(name)
