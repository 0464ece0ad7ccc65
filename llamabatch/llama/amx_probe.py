"""The AMX probe: load a model with llama.cpp's default weight layout (AMX included where the
build has it) and run one prefill of 32 rows and a few decode steps (`run_probe`).

It runs only in a throwaway subprocess (`python -m llamabatch --process amx-probe MODEL`, started by
cpu_buffers.probe_amx): where AMX is listed but not enabled (some VMs), the first tile
instruction kills that process with SIGILL, and the caller reads that as "AMX does not run
here". A decode llama.cpp refuses raises AmxProbeFailed, which that process's exit status says.
"""
from __future__ import annotations

from ..config import EngineConfig
from ..core.plan import Chunk, StepPlan
from ..errors import LlamaBatchError
from ..params import SamplingParams
from ..kernel_paths.cpu_buffers import KernelPath


class AmxProbeFailed(LlamaBatchError):
    """A probe decode returned a non-zero status: the default layout does not decode here."""

    code = "amx_probe_failed"


def run_probe(model_path: str) -> None:
    """Prefill 32 rows (the AMX tile path, M > 1), then decode single rows (its VNNI path).
    Raises AmxProbeFailed when a decode fails; a CPU that cannot run the tiles ends the process."""
    from .runner import LlamaRunner

    config = EngineConfig(model=model_path, n_parallel=1, n_ctx=256, threads=1, cache_prompt=False)
    runner = LlamaRunner(config, model_path, KernelPath("llama.cpp default", True, False, "AMX probe"))
    sampler = runner.build_sampler(SamplingParams(temperature=0), 0)
    try:
        tokens = (runner.tokenize("The sea is wide and the sea is deep. " * 8, special=False) * 4)[:32]
        result = runner.execute(StepPlan([Chunk(0, 0, tokens, 0, True, False, sampler=sampler)]))
        for i in range(4):
            if result.status != 0:
                raise AmxProbeFailed(f"llama_decode returned {result.status} on probe step {i}")
            if i < 3:
                result = runner.execute(StepPlan([Chunk(0, 0, [result.sampled[0]], len(tokens) + i, True, True,
                                                        sampler=sampler)]))
    finally:
        runner.free_sampler(sampler)
        runner.close()
