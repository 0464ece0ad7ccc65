"""The folder llamabatch keeps its own files in: the assembled bundled model, verification
stamps, measured slot counts, machine verdicts. Nothing here imports another llamabatch module,
so every models/ and llama/ module can ask for it without an import cycle."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "LLAMABATCH_CACHE_DIR"


def cache_dir() -> Path:
    """$LLAMABATCH_CACHE_DIR, else $XDG_CACHE_HOME/llamabatch, else ~/.cache/llamabatch."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llamabatch"
