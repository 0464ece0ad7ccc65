"""The processes llamabatch starts of itself, each by a registered name.

A lower layer that needs a process of its own (the supervised engine's child, the AMX probe)
asks for it by name here: `command(ENGINE_CHILD)` is `python -m llamabatch --process
engine-child`. The package's console entry (__main__.py) hands such a command to
cli/process_entries.py, which runs the entry and turns its outcome into the exit status: only
the CLI ends the process, and no module below it names a module of the CLI.
"""
from __future__ import annotations

import sys

PROCESS_FLAG = "--process"
ENGINE_CHILD = "engine-child"  # supervised/child.py: the supervised engine's child process
AMX_PROBE = "amx-probe"        # llama/amx_probe.py: can this CPU run AMX tiles? (argument: MODEL)
NAMES = (ENGINE_CHILD, AMX_PROBE)


def command(name: str, *args: str) -> list[str]:
    """The argv that starts the registered process `name` with this Python."""
    if name not in NAMES:
        raise ValueError(f"no process entry named {name!r} (registered: {', '.join(NAMES)})")
    return [sys.executable, "-m", "llamabatch", PROCESS_FLAG, name, *args]
