"""The config-file layer of option resolution (flags > env > file > defaults)."""
from __future__ import annotations

from typing import Any


def file_values_for(command: str) -> dict[str, tuple[Any, str]]:
    """Values from the config file for `command`: key -> (value, "file:line").

    No config file is read yet (issue: configuration file); every key falls through to
    the environment or the built-in default.
    """
    return {}
