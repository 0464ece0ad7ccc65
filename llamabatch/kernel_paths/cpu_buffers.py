"""Which of llama.cpp's CPU weight layouts the engine loads a model with: `cpu_buffers`.

llama.cpp keeps weights either in plain CPU buffers (as in the file) or in "extra" buffer
types that re-lay them out for faster kernels: CPU_REPACK (rows interleaved for 4-row gemm
tiles: Q4_0 / Q4_K / IQ4_NL / MXFP4 on AVX2, more on ARM), AMX (Intel tile kernels, compiled
in only when the build machine lists AMX), KleidiAI (ARM). The layout decides which kernels
run, so both speed and how a row rounds (deterministic mode's shapes: batch_invariance.py).

  - "plain":  no extra buffer types; ggml's vec_dot / tiled / llamafile kernels.
  - "repack": CPU_REPACK and nothing else, whatever else the build has (the tensors ggml
              would repack on this CPU are pinned to it by name: tensor_buft_overrides).
  - "auto":   llama.cpp's own default (every extra buffer type of the build), except where
              the build has AMX and AMX does not run here: then "repack". Whether AMX runs is
              decided by use, not by the CPUID flag (a VM can list AMX and still trap at the
              first tile instruction): a throwaway subprocess loads the model with AMX and
              decodes; a child that dies (SIGILL) is the answer "no". The verdict is cached
              per machine and llama-cpp-python version (machine_verdicts).
Deterministic mode never takes AMX: its row rules are derived for CPU_REPACK and plain
kernels only, so with AMX in the build "auto" means "repack" there.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence

from ..config import CPU_BUFFERS
from ..processes import entries
from . import machine_verdicts

CHOICES = CPU_BUFFERS  # what EngineConfig.cpu_buffers may hold
REPACK = "CPU_REPACK"  # ggml-cpu's names for its extra buffer types
AMX = "AMX"
PROBE_TIMEOUT = 120.0  # seconds: a probe that hangs is a "no" too


@dataclass(frozen=True)
class KernelPath:
    """How to load the weights: what llama.cpp is told, and why (for the header line)."""

    name: str  # "llama.cpp default" | "repack" | "plain"
    use_extra_bufts: bool
    pin_repack: bool  # tensors ggml would repack here are overridden to CPU_REPACK by name
    why: str


def resolve(choice: str, extra_bufts: Sequence[str], amx_runs: Callable[[], tuple[bool, str]],
            deterministic: bool = False) -> KernelPath:
    """The path for `choice` given this build's extra CPU buffer types (names, e.g.
    ["AMX", "CPU_REPACK"]). `amx_runs()` is asked only when it matters: ("auto" with AMX)."""
    extras = list(extra_bufts)
    if choice == "plain":
        return KernelPath("plain", False, False, "cpu_buffers=plain")
    if choice == "repack":
        if REPACK not in extras:
            raise ValueError(f"cpu_buffers=repack: this llama.cpp build has no {REPACK} buffer type "
                             f"(its extra CPU buffer types: {', '.join(extras) or 'none'})")
        return KernelPath("repack", False, True, "cpu_buffers=repack")
    if choice != "auto":
        raise ValueError(f"cpu_buffers must be one of {', '.join(CHOICES)}, got {choice!r}")
    fallback = ((lambda why: KernelPath("repack", False, True, why)) if REPACK in extras
                else (lambda why: KernelPath("plain", False, False, why)))
    if AMX in extras:
        if deterministic:
            return fallback("cpu_buffers=auto, deterministic: AMX's row rules are not derived, so no AMX")
        ok, why = amx_runs()
        if not ok:
            return fallback(f"cpu_buffers=auto: AMX is built in but does not run here ({why})")
        return KernelPath("llama.cpp default", True, False, f"cpu_buffers=auto: {', '.join(extras)} (AMX ran in a probe)")
    if not extras:
        return KernelPath("plain", False, False, "cpu_buffers=auto: this build has no extra CPU buffer types")
    return KernelPath("llama.cpp default", True, False, f"cpu_buffers=auto: {', '.join(extras)}")


def test_paths(extra_bufts: Sequence[str], amx_runs: Callable[[], tuple[bool, str]]) -> list[str]:
    """The `cpu_buffers` values whose kernels differ on this machine: what a suite covers."""
    paths = ["plain"] + (["repack"] if REPACK in extra_bufts else [])
    if AMX in extra_bufts and amx_runs()[0]:
        paths.append("auto")  # AMX: a third kernel family
    return paths


# -- AMX by use -----------------------------------------------------------------------------

def amx_verdict(model_path: str, run_probe: Callable[[str], tuple[bool, str]] | None = None) -> tuple[bool, str]:
    """(AMX runs here, why), from the cache or from one probe subprocess."""
    key = machine_verdicts.verdict_key("amx")
    cached = machine_verdicts.read_verdict(key)
    if cached is not None:
        return cached["ok"], f"{cached.get('why', '')} (cached)"
    ok, why = (run_probe or probe_amx)(model_path)
    machine_verdicts.write_verdict(key, ok, why)
    return ok, why


def probe_amx(model_path: str, command: Sequence[str] | None = None, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """Run the AMX probe (llama/amx_probe.py, through its registered process entry) in a
    throwaway subprocess. Whatever happens to the child — SIGILL, abort, a hang — is the
    answer "no", never an error of the caller."""
    cmd = list(command or entries.command(entries.AMX_PROBE, model_path))
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return False, f"the probe did not finish in {timeout:.0f} s"
    except OSError as exc:
        return False, f"the probe could not start: {exc}"
    if proc.returncode == 0:
        return True, "a probe decode with AMX weights finished"
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return False, f"the probe died with {name}"
    tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return False, f"the probe exited {proc.returncode}" + (f": {tail[0][:200]}" if tail[0] else "")


def env_choice() -> str | None:
    """LLAMABATCH_CPU_BUFFERS: the suite's and the benchmarks' way to choose for every engine."""
    value = os.environ.get("LLAMABATCH_CPU_BUFFERS", "").strip()
    return value or None


def chosen(value: str | None) -> str:
    """What an EngineConfig.cpu_buffers value means: unset is $LLAMABATCH_CPU_BUFFERS, else auto."""
    return value or env_choice() or "auto"
