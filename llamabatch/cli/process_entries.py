"""The processes llamabatch starts of itself (processes/entries.py), run by name from
`python -m llamabatch --process NAME [ARGS]`: each entry's outcome becomes the exit status.

engine-child: the supervised engine's child (supervised/child.py's serve_parent): 0 served, or
  the parent was gone before it started; 1 the engine did not load.
amx-probe MODEL: the AMX probe (llama/amx_probe.py): 0 it ran; 3 a decode failed; 2 usage. A
  CPU that cannot run AMX tiles kills this process (SIGILL) before it exits at all.
"""
from __future__ import annotations

import sys

from ..processes.entries import AMX_PROBE, ENGINE_CHILD, NAMES, PROCESS_FLAG

EXIT_USAGE = 2
EXIT_DECODE_FAILED = 3


def engine_child(argv: list[str]) -> int:
    from ..supervised.child import ParentGone, serve_parent

    try:
        return serve_parent()
    except ParentGone:
        return 0


def amx_probe(argv: list[str]) -> int:
    from ..llama.amx_probe import AmxProbeFailed, run_probe

    if len(argv) != 1:
        print(f"usage: python -m llamabatch {PROCESS_FLAG} {AMX_PROBE} MODEL.gguf", file=sys.stderr)
        return EXIT_USAGE
    try:
        run_probe(argv[0])
    except AmxProbeFailed as exc:
        print(f"amx probe: {exc}", file=sys.stderr)
        return EXIT_DECODE_FAILED
    return 0


ENTRIES = {ENGINE_CHILD: engine_child, AMX_PROBE: amx_probe}


def run_entry(argv: list[str]) -> int:
    """argv: NAME [ARGS...] (what follows --process)."""
    if not argv or argv[0] not in ENTRIES:
        print(f"usage: python -m llamabatch {PROCESS_FLAG} {{{','.join(NAMES)}}} [ARGS]", file=sys.stderr)
        return EXIT_USAGE
    return ENTRIES[argv[0]](argv[1:])
