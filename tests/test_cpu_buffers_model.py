"""cpu_buffers on the bundled Gemma 3 270M, for real: the repack layout pinned by name is the
layout llama.cpp chooses itself, the AMX probe subprocess runs the model, deterministic
mode's self-check holds on each layout, and `run` says which kernels it runs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from llamabatch import EngineConfig, SamplingParams
from llamabatch.kernel_paths.cpu_buffers import KernelPath, probe_amx
from llamabatch.core.plan import Chunk, StepPlan

pytestmark = pytest.mark.model


def greedy_tokens(runner, text: str, n: int) -> list[int]:
    sampler = runner.build_sampler(SamplingParams(temperature=0), 0)
    try:
        tokens = runner.tokenize(text, special=False)
        out = [runner.execute(StepPlan([Chunk(0, 0, tokens, 0, True, False, sampler=sampler)])).sampled[0]]
        for i in range(n - 1):
            result = runner.execute(StepPlan([Chunk(0, 0, [out[-1]], len(tokens) + i, True, True, sampler=sampler)]))
            out.append(result.sampled[0])
        return out
    finally:
        runner.free_sampler(sampler)


def test_repack_pinned_by_name_is_the_layout_llama_cpp_chooses_itself(model_path):
    from llamabatch.llama.cpu_kernels import cpu_extra_buffer_types
    from llamabatch.llama.runner import LlamaRunner

    config = EngineConfig(model=model_path, n_parallel=1, n_ctx=256)
    pinned = LlamaRunner(config.replace(cpu_buffers="repack"), model_path)
    try:
        assert not pinned.kernels.use_extra_bufts and pinned.kernels.pin_repack
        assert pinned.weight_buffers.get("CPU_REPACK", 0) > 0 and "AMX" not in pinned.weight_buffers
        pinned_tokens = greedy_tokens(pinned, "The lighthouse keeper wrote", 12)
        pinned_buffers = pinned.weight_buffers
    finally:
        pinned.close()
    if set(cpu_extra_buffer_types()) != {"CPU_REPACK"}:
        return  # llama.cpp's own choice includes AMX or KleidiAI here: another layout, nothing to equal
    own = LlamaRunner(config, model_path, KernelPath("llama.cpp default", True, False, "test"))
    try:
        # the same tensors repacked (same buffer sizes) and the same kernels (same tokens)
        assert own.weight_buffers == pinned_buffers
        assert greedy_tokens(own, "The lighthouse keeper wrote", 12) == pinned_tokens
    finally:
        own.close()


def test_the_amx_probe_subprocess_runs_the_model(model_path):
    from llamabatch.llama.cpu_kernels import cpu_extra_buffer_types

    ok, why = probe_amx(model_path)
    if "AMX" not in cpu_extra_buffer_types():
        assert (ok, why) == (True, "a probe decode with AMX weights finished")  # nothing here can trap
    else:
        assert isinstance(ok, bool) and why  # it either ran or named how it died


def test_self_check_holds_on_each_layout(model_path, cpu_path, monkeypatch):
    from llamabatch.kernel_paths import determinism_check
    from llamabatch.llama.runner import LlamaRunner

    runner = LlamaRunner(EngineConfig(model=model_path, n_parallel=2, n_ctx=1024, deterministic=True,
                                      cpu_buffers=cpu_path), model_path)
    # the check's own two probe runs, recorded as it makes them: running the probe twice more
    # after it doubled the test's time and compared the same two things again
    generate, runs = determinism_check.generate, {}

    def recorded(runner_, *, with_fillers, **kw):
        runs[with_fillers] = generate(runner_, with_fillers=with_fillers, **kw)
        return runs[with_fillers]

    monkeypatch.setattr(determinism_check, "generate", recorded)
    try:
        assert (runner.shapes.tile, runner.shapes.min_rows) == (4, 8)  # Q6_K/Q5_0 stay plain: tiled from 8 rows
        determinism_check.check(runner, cache=False)  # measured now, not read from the cache
        alone = runs[False]
        assert len(alone) == determinism_check.PROBE_TOKENS
        assert runs[True] == alone
    finally:
        runner.close()


def test_run_header_names_the_kernels(tmp_path, model_path):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(src), "--n-parallel", "1", "--n-ctx", "256",
                           "--max-tokens", "1", "--cpu-buffers", "plain", "--model", model_path],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    header = proc.stderr.splitlines()[0]
    assert "plain kernels (cpu_buffers=plain; weights: CPU_Mapped" in header
