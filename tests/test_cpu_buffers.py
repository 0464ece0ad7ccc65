"""cpu_buffers: which weight layout (and so which llama.cpp kernels) the engine loads with,
AMX decided by a probe subprocess, the per-machine verdict cache, the repack rule mirrored
from ggml-cpu and deterministic mode's row rule derived from the kernels in use. No model."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from cli_harness import invoke
from llamabatch import EngineConfig
from llamabatch.kernel_paths import machine_verdicts
from llamabatch.kernel_paths import batch_invariance as inv
from llamabatch.kernel_paths import cpu_buffers
from llamabatch.settings.layers import merge
from llamabatch.errors import DeterminismUnavailable, InvalidRequest
from llamabatch.models.gguf_header import TensorInfo
from llamabatch.kernel_paths.repack_rule import Q4_0, Q4_K, Q6_K, Q8_0, is_repacked

NEVER = lambda: pytest.fail("the AMX probe was asked where it does not matter")  # noqa: E731


# -- choosing the path ---------------------------------------------------------------------------

def test_plain_turns_every_extra_buffer_type_off():
    path = cpu_buffers.resolve("plain", ["AMX", "CPU_REPACK"], NEVER)
    assert (path.name, path.use_extra_bufts, path.pin_repack) == ("plain", False, False)


def test_repack_pins_cpu_repack_alone_even_with_amx_in_the_build():
    path = cpu_buffers.resolve("repack", ["AMX", "CPU_REPACK"], NEVER)
    assert (path.name, path.use_extra_bufts, path.pin_repack) == ("repack", False, True)


def test_repack_without_cpu_repack_in_the_build_is_one_clear_error():
    with pytest.raises(ValueError, match="this llama.cpp build has no CPU_REPACK buffer type .*KLEIDIAI"):
        cpu_buffers.resolve("repack", ["KLEIDIAI"], NEVER)


def test_auto_without_amx_is_llama_cpp_s_default_and_asks_no_probe():
    path = cpu_buffers.resolve("auto", ["CPU_REPACK"], NEVER)
    assert path.use_extra_bufts and not path.pin_repack and "CPU_REPACK" in path.why
    assert cpu_buffers.resolve("auto", [], NEVER).name == "plain"


def test_auto_with_amx_that_runs_keeps_amx_and_repack():
    path = cpu_buffers.resolve("auto", ["AMX", "CPU_REPACK"], lambda: (True, "ran"))
    assert path.use_extra_bufts and "AMX ran in a probe" in path.why


def test_auto_with_amx_that_traps_falls_back_to_repack_then_plain():
    trap = lambda: (False, "the probe died with SIGILL")  # noqa: E731
    path = cpu_buffers.resolve("auto", ["AMX", "CPU_REPACK"], trap)
    assert (path.name, path.use_extra_bufts, path.pin_repack) == ("repack", False, True)
    assert "does not run here (the probe died with SIGILL)" in path.why
    assert cpu_buffers.resolve("auto", ["AMX"], trap).name == "plain"


def test_deterministic_auto_never_takes_amx():
    path = cpu_buffers.resolve("auto", ["AMX", "CPU_REPACK"], NEVER, deterministic=True)
    assert path.name == "repack" and "AMX's row rules are not derived" in path.why


def test_the_suite_covers_each_layout_the_machine_can_run():
    assert cpu_buffers.test_paths(["CPU_REPACK"], NEVER) == ["plain", "repack"]
    assert cpu_buffers.test_paths([], NEVER) == ["plain"]
    assert cpu_buffers.test_paths(["AMX", "CPU_REPACK"], lambda: (True, "")) == ["plain", "repack", "auto"]
    assert cpu_buffers.test_paths(["AMX", "CPU_REPACK"], lambda: (False, "")) == ["plain", "repack"]


def test_unknown_value_is_a_one_line_config_error():
    with pytest.raises(InvalidRequest, match=r'^cpu_buffers must be one of "auto", "plain", "repack", got \'fast\'$'):
        EngineConfig(cpu_buffers="fast").validate()
    with pytest.raises(InvalidRequest, match="unknown engine setting"):
        EngineConfig.from_dict({"cpu_buffer": "plain"})


def test_unknown_value_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    prompts = tmp_path / "in.txt"
    prompts.write_text("hello\n")
    result = invoke(["run", str(prompts), "--cpu-buffers", "fast"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cpu_buffers must be one of" in lines[0] and "'fast'" in lines[0]


def test_flag_and_env_reach_engine_config(monkeypatch):
    monkeypatch.delenv("LLAMABATCH_CPU_BUFFERS", raising=False)
    assert merge({}, "run").engine.cpu_buffers is None
    assert merge({"cpu_buffers": "plain"}, "run").engine.cpu_buffers == "plain"
    monkeypatch.setenv("LLAMABATCH_CPU_BUFFERS", "repack")
    assert merge({}, "run").engine.cpu_buffers == "repack"
    assert cpu_buffers.env_choice() == "repack"  # the library's default too (EngineConfig.cpu_buffers=None)


# -- AMX by use: the probe subprocess ------------------------------------------------------------

def test_a_probe_that_dies_with_sigill_is_the_answer_no():
    ok, why = cpu_buffers.probe_amx("m.gguf", [sys.executable, "-c",
                                               "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    assert ok is False and why == f"the probe died with {signal.SIGILL.name}"


def test_a_probe_that_exits_0_is_the_answer_yes_and_other_exits_are_no():
    assert cpu_buffers.probe_amx("m.gguf", [sys.executable, "-c", "pass"])[0] is True
    ok, why = cpu_buffers.probe_amx("m.gguf", [sys.executable, "-c", "import sys; sys.exit('no tiles')"])
    assert ok is False and why == "the probe exited 1: no tiles"


def test_a_probe_that_hangs_is_the_answer_no():
    ok, why = cpu_buffers.probe_amx("m.gguf", [sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert ok is False and "did not finish" in why


def test_a_probe_that_cannot_start_is_the_answer_no():
    ok, why = cpu_buffers.probe_amx("m.gguf", ["/nonexistent/python"])
    assert ok is False and "could not start" in why


def test_the_verdict_is_cached_per_machine_and_llama_cpp_python_version(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    calls = []

    def probe(path):
        calls.append(path)
        return False, "the probe died with SIGILL"

    assert cpu_buffers.amx_verdict("m.gguf", probe) == (False, "the probe died with SIGILL")
    ok, why = cpu_buffers.amx_verdict("m.gguf", probe)
    assert (ok, why, len(calls)) == (False, "the probe died with SIGILL (cached)", 1)
    # another llama-cpp-python version (or CPU) asks again: its kernels may differ
    monkeypatch.setattr(machine_verdicts, "llama_cpp_version", lambda: "9.9.9")
    assert cpu_buffers.amx_verdict("m.gguf", lambda p: (True, "ran")) == (True, "ran")
    monkeypatch.setattr(machine_verdicts, "cpu_identity", lambda: "x86_64 Other CPU flags=0")
    assert cpu_buffers.amx_verdict("m.gguf", probe)[0] is False and len(calls) == 2


def test_a_damaged_verdict_cache_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    (tmp_path / "verdicts.json").write_text("{not json")
    assert cpu_buffers.amx_verdict("m.gguf", lambda p: (True, "ran")) == (True, "ran")
    assert cpu_buffers.amx_verdict("m.gguf", lambda p: pytest.fail("cached"))[0] is True


# -- the repack rule (ggml_repack_get_optimal_repack_type) ---------------------------------------

X86 = {"avx2": True, "avx512": False}
ARM_DOTPROD = {"neon": True, "dotprod": True}


@pytest.mark.parametrize("tensor, features, want", [
    (TensorInfo("blk.0.ffn_up.weight", (640, 2048), Q4_K), X86, True),
    (TensorInfo("blk.0.ffn_up.weight", (640, 2044), Q4_K), X86, False),  # rows not a multiple of 8
    (TensorInfo("blk.0.ffn_up.weight", (640, 2048), Q6_K), X86, False),  # no Q6_K layout on x86
    (TensorInfo("blk.0.ffn_up.weight", (640, 2048), Q8_0), X86, False),
    (TensorInfo("blk.0.attn_q.weight", (640, 1028), Q4_0), ARM_DOTPROD, True),  # ARM: rows % 4
    (TensorInfo("blk.0.attn_q.weight", (640, 1024), Q6_K), ARM_DOTPROD, True),
    (TensorInfo("blk.0.attn_q.weight", (640, 1024), Q8_0), ARM_DOTPROD, True),
    (TensorInfo("token_embd.weight", (640, 262144), Q4_K), X86, False),  # read by row lookup
    (TensorInfo("blk.0.ffn_gate_exps.weight", (640, 2048, 8), Q4_K), X86, False),  # 3-D: MoE experts
    (TensorInfo("blk.0.ffn_up.weight", (640, 2048), Q4_K), {"sve": True}, False),  # not mirrored: stays plain
])
def test_repack_rule_mirrors_ggml(tensor, features, want):
    assert is_repacked(tensor, features) is want


# -- deterministic mode's row rule ---------------------------------------------------------------

def test_row_rule_on_x86_repack_with_unrepacked_k_quants_is_tiles_of_4_at_least_8():
    shapes = inv.derive_shapes([(Q4_K, True), (Q6_K, False), (Q8_0, False)], x86=True)
    assert (shapes.tile, shapes.min_rows) == (4, 8)
    assert "CPU_REPACK gemm in 4-row tiles" in shapes.why and "tiled K-quant matmul from 8 rows" in shapes.why


def test_row_rule_without_the_tiled_kernel_needs_only_the_gemm_tile():
    assert (inv.derive_shapes([(Q4_0, True), (Q8_0, False)], x86=True).min_rows) == 4
    assert (inv.derive_shapes([(Q4_K, True), (Q6_K, True)], x86=False).min_rows) == 4  # ARM: no tiled kernel


def test_passes_follow_the_derived_rule():
    from llamabatch.core.plan import Chunk

    shapes = inv.Shapes(tile=4, min_rows=4, why="test")
    p = inv.prefill_pass([Chunk(0, 0, [1, 2, 3, 4, 5], 0, True, False)], shapes)
    assert len(p.rows) == 8 and sum(r.logits for r in p.rows) == 4
    assert len(inv.decode_pass([Chunk(0, 0, [1], 9, True, True)], 4, lambda s: 0, shapes).rows) == 4 * inv.DECODE_ROWS  # each stream: the token and a padding row
    assert inv.n_sequence_ids(1, shapes) == 4 and inv.extra_cells(shapes) == 3


# -- the self-check's refusal --------------------------------------------------------------------

class ProbeRunner:
    """Just what determinism_check reads from a runner."""

    model_path = "never-loaded.gguf"
    kernels = cpu_buffers.KernelPath("repack", False, True, "cpu_buffers=repack")
    weight_buffers = {"CPU_Mapped": 235.0, "CPU_REPACK": 13.0}
    shapes = inv.Shapes(4, 8, "CPU_REPACK gemm in 4-row tiles")
    slot_ctx = 512


def test_self_check_refuses_in_one_line_naming_the_kernels_and_caches_it(monkeypatch, tmp_path):
    from llamabatch.kernel_paths import determinism_check

    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    answers = {False: [1, 2, 3], True: [1, 2, 4]}
    monkeypatch.setattr(determinism_check, "generate", lambda runner, with_fillers: answers[with_fillers])
    with pytest.raises(DeterminismUnavailable) as err:
        determinism_check.check(ProbeRunner())
    line = str(err.value)
    assert "\n" not in line and "different tokens alone and batched" in line
    assert "repack weights: CPU_Mapped 235 MiB, CPU_REPACK 13 MiB" in line and "tiles of 4, at least 8" in line
    # cached: the next process refuses without generating again
    monkeypatch.setattr(determinism_check, "generate", lambda runner, with_fillers: pytest.fail("not cached"))
    with pytest.raises(DeterminismUnavailable):
        determinism_check.check(ProbeRunner())


def test_self_check_passes_when_the_tokens_agree(monkeypatch, tmp_path):
    from llamabatch.kernel_paths import determinism_check

    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(determinism_check, "generate", lambda runner, with_fillers: [5, 6, 7])
    determinism_check.check(ProbeRunner())
    assert machine_verdicts.read_verdict(machine_verdicts.verdict_key(
        "deterministic", "never-loaded.gguf", "repack", "tile=4", "min_rows=8"))["ok"] is True


def test_self_check_in_a_slot_too_small_for_its_probe_says_so(monkeypatch, tmp_path):
    from llamabatch.kernel_paths import determinism_check

    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    runner = ProbeRunner()
    runner.slot_ctx = 9  # --n-ctx 16 per slot, less the padding cells
    monkeypatch.setattr(determinism_check, "generate", lambda runner, with_fillers: pytest.fail("no room to run"))
    with pytest.raises(DeterminismUnavailable, match=r"self-check needs 48 tokens per slot; this context gives 9"):
        determinism_check.check(runner)


def test_the_probes_registered_process_entry_answers_by_its_exit_status():
    # The probe starts as `python -m llamabatch --process amx-probe MODEL`; without MODEL the
    # entry answers 2 (usage), which probe_amx reads as "no", never as an error of its own.
    from llamabatch.processes import entries

    proc = subprocess.run(entries.command(entries.AMX_PROBE), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--process amx-probe MODEL.gguf" in proc.stderr
    assert cpu_buffers.probe_amx("m.gguf", entries.command(entries.AMX_PROBE))[0] is False
