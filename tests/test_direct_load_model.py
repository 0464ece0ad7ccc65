"""llamabatch/llama/direct_load.py on a CPU that lists AMX and traps it, forced here: the build's
extra buffer types say AMX and the AMX probe's child dies with SIGILL. Tests and benchmarks
that load weights themselves must then get the layout the engine takes (CPU_REPACK alone, or
plain), never llama.cpp's default, which would put the weights in AMX and crash the worker."""
from __future__ import annotations

import sys

import pytest
from llama_cpp import llama_cpp as C

from llamabatch.kernel_paths import cpu_buffers

from llamabatch.llama import cpu_kernels

from llamabatch.llama import direct_load

from llamabatch.llama import load
from llamabatch.llama.backend import log_mark, weight_buffers

SIGILL_CHILD = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]


@pytest.fixture
def amx_listed_but_trapping(monkeypatch, tmp_path):
    """This build 'has' AMX beside its real CPU_REPACK, and the probe's child dies with SIGILL
    as on such a VM. Returns the probe's calls. The verdict cache is a folder of the test's own."""
    real = cpu_kernels.cpu_extra_buffer_types()
    assert cpu_buffers.REPACK in real, "this llama.cpp build has no CPU_REPACK buffer type to fall back to"
    monkeypatch.setattr(cpu_kernels, "cpu_extra_buffer_types", lambda: {cpu_buffers.AMX: 0, **real})
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LLAMABATCH_CPU_BUFFERS", raising=False)
    real_probe = cpu_buffers.probe_amx
    calls = []

    def trapping_probe(model_path):
        calls.append(model_path)
        return real_probe(model_path, SIGILL_CHILD)

    monkeypatch.setattr(cpu_buffers, "probe_amx", trapping_probe)
    return calls


def test_weights_take_cpu_repack_alone_when_amx_is_listed_but_traps(model_path, amx_listed_but_trapping,
                                                                     monkeypatch):
    path = direct_load.weights_kernel_path(model_path)
    assert amx_listed_but_trapping == [model_path]  # the probe decided, in its own process
    assert (path.name, path.use_extra_bufts, path.pin_repack) == ("repack", False, True)
    assert "does not run here (the probe died with SIGILL)" in path.why
    handed_to_llama_cpp = []  # the model parameters the load really used: the kernel path's, not the defaults

    def recorded(kernels, model):
        params = cpu_kernels.model_params(kernels, model)
        handed_to_llama_cpp.append((params.use_extra_bufts, bool(params.tensor_buft_overrides)))
        return params

    monkeypatch.setattr(load, "model_params", recorded)
    mark = log_mark()
    model = direct_load.load_weights(model_path)
    try:
        buffers = weight_buffers(mark)
    finally:
        C.llama_model_free(model)
    assert handed_to_llama_cpp == [(False, True)]  # no extra buffer type but CPU_REPACK, pinned by name
    assert cpu_buffers.AMX not in buffers and buffers.get(cpu_buffers.REPACK, 0) > 0, buffers


def test_llamabatch_cpu_buffers_chooses_without_a_probe(model_path, amx_listed_but_trapping, monkeypatch):
    monkeypatch.setenv("LLAMABATCH_CPU_BUFFERS", "plain")
    path = direct_load.weights_kernel_path(model_path)
    assert (path.name, path.use_extra_bufts, path.pin_repack) == ("plain", False, False)
    assert amx_listed_but_trapping == []


def test_a_vocabulary_loads_without_weights_or_a_probe(model_path, amx_listed_but_trapping):
    mark = log_mark()
    model = direct_load.load_vocabulary(model_path)
    try:
        assert C.llama_vocab_n_tokens(C.llama_model_get_vocab(model)) > 1000
        assert weight_buffers(mark) == {}
    finally:
        C.llama_model_free(model)
    assert amx_listed_but_trapping == []
