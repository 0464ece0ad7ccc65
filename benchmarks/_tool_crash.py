"""One line for a llama.cpp tool (llama-server, llama-batched-bench) that a signal killed.

Those tools load the weights on llama.cpp's default layout, AMX included where the build has
it; a CPU (a VM) can list AMX and trap its tile instructions, and the tool then dies with
SIGILL. The engine probes AMX first and never takes it there; the tools can only be told to
take no extra buffer type (--no-repack), which is what --cpu-buffers plain gives them. So a
benchmark says that, instead of printing a traceback."""
from __future__ import annotations

import signal

# Signals a CPU that cannot run the tools' kernels ends them with (shells report 128 + n).
CRASH_SIGNALS = (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE)


def killing_signal(returncode: int | None) -> signal.Signals | None:
    """The crash signal a tool's exit status says it died of (-n from Python, 128 + n from a shell)."""
    if returncode is None or returncode == 0:
        return None
    number = -returncode if returncode < 0 else returncode - 128
    for sig in CRASH_SIGNALS:
        if sig == number:
            return sig
    return None


def crash_line(tool: str, returncode: int | None, cpu_buffers: str) -> str | None:
    """What to tell the user when `tool` died of a crash signal (None when it did not):
    `cpu_buffers` is the choice this run made (auto, plain, repack)."""
    sig = killing_signal(returncode)
    if sig is None:
        return None
    cause = (" (an instruction set this CPU lists traps, such as AMX on some VMs)" if sig == signal.SIGILL
             else "")
    if cpu_buffers == "plain":
        return (f"llama.cpp's own {tool} died with {sig.name} on this CPU{cause}, even with --cpu-buffers plain "
                f"(--no-repack): its kernels do not run here")
    return (f"llama.cpp's own {tool} died with {sig.name} on this CPU{cause}; rerun with --cpu-buffers plain "
            f"(or LLAMABATCH_CPU_BUFFERS=plain), which starts llama.cpp's tools with --no-repack")
