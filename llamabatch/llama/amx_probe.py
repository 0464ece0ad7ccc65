"""`python -m llamabatch.llama.amx_probe MODEL`: load MODEL with llama.cpp's default weight layout
(AMX included where the build has it) and run one prefill of 32 rows and a few decode steps.

Run only as a throwaway subprocess by cpu_buffers.probe_amx: where AMX is listed but not
enabled (some VMs), the first tile instruction kills this process with SIGILL, and the
caller reads that as "AMX does not run here". Exit 0: it ran.
"""
from __future__ import annotations

import sys

from ..config import EngineConfig
from .cpu_buffers import KernelPath
from ..params import SamplingParams
from ..core.plan import Chunk, StepPlan


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m llamabatch.llama.amx_probe MODEL.gguf", file=sys.stderr)
        return 2
    from .runner import LlamaRunner

    config = EngineConfig(model=argv[0], n_parallel=1, n_ctx=256, threads=1, cache_prompt=False)
    runner = LlamaRunner(config, argv[0], KernelPath("llama.cpp default", True, False, "AMX probe"))
    sampler = runner.build_sampler(SamplingParams(temperature=0), 0)
    try:
        # 32 prompt rows: the AMX tile path (M > 1), then single rows (its VNNI path)
        tokens = (runner.tokenize("The sea is wide and the sea is deep. " * 8, special=False) * 4)[:32]
        result = runner.execute(StepPlan([Chunk(0, 0, tokens, 0, True, False, sampler=sampler)]))
        for i in range(3):
            if result.status != 0:
                return 3
            result = runner.execute(StepPlan([Chunk(0, 0, [result.sampled[0]], len(tokens) + i, True, True, sampler=sampler)]))
        return 0 if result.status == 0 else 3
    finally:
        runner.free_sampler(sampler)
        runner.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
