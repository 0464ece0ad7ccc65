"""`python -m llamabatch.cli.amx_probe MODEL`: the AMX probe (llama/amx_probe.py) in a process
of its own, started by cpu_buffers.probe_amx. Exit 0: it ran; 3: a decode failed; 2: usage.
A CPU that cannot run AMX tiles kills this process (SIGILL) before it exits at all.
"""
from __future__ import annotations

import sys

from ..llama.amx_probe import AmxProbeFailed, run_probe

EXIT_DECODE_FAILED = 3


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m llamabatch.cli.amx_probe MODEL.gguf", file=sys.stderr)
        return 2
    try:
        run_probe(argv[0])
    except AmxProbeFailed as exc:
        print(f"amx probe: {exc}", file=sys.stderr)
        return EXIT_DECODE_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
