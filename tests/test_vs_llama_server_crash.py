"""benchmarks/vs_llama_server.py when llama.cpp's own tools die on this CPU (SIGILL where the CPU
lists AMX and traps it): one line that says so and points to --cpu-buffers plain, not a
traceback. The tools are stubs here: shell scripts that kill themselves with a signal."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamabatch.kernel_paths.cpu_buffers import KernelPath

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def vs(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delenv("LLAMABATCH_CPU_BUFFERS", raising=False)
    import vs_llama_server

    monkeypatch.setattr(vs_llama_server, "CPU_BUFFERS", None)
    return vs_llama_server


@pytest.fixture
def crash():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _tool_crash

        yield _tool_crash
    finally:
        sys.path.remove(str(BENCHMARKS))


def stub_tool(folder: Path, name: str, signal_name: str = "ILL") -> Path:
    """A `name` that writes its arguments to `name`.args and then dies of SIG`signal_name`."""
    path = folder / name
    path.write_text(f'#!/bin/sh\necho "$@" > "$0.args"\nkill -{signal_name} $$\n')
    path.chmod(0o755)
    return path


def test_the_killing_signal_is_read_from_python_and_shell_exit_statuses(crash):
    import signal

    assert crash.killing_signal(-signal.SIGILL) == signal.SIGILL
    assert crash.killing_signal(128 + signal.SIGILL) == signal.SIGILL  # 132, as a shell reports it
    assert crash.killing_signal(-signal.SIGSEGV) == signal.SIGSEGV
    for not_a_crash in (0, 1, 2, None, -signal.SIGTERM):
        assert crash.killing_signal(not_a_crash) is None
    assert crash.crash_line("llama-server", 1, "auto") is None


def test_a_batched_bench_that_dies_with_sigill_ends_the_run_in_one_line(vs, tmp_path, monkeypatch):
    monkeypatch.setattr(vs, "same_kernels", lambda model: [])  # auto on a build without AMX: no flag
    binary = stub_tool(tmp_path, "llama-batched-bench")
    with pytest.raises(SystemExit) as ended:
        vs.batched_bench(str(binary), "m.gguf", 2, [1, 4])
    line = str(ended.value.code)
    assert "\n" not in line
    assert line.startswith("llama.cpp's own llama-batched-bench died with SIGILL on this CPU")
    assert "rerun with --cpu-buffers plain" in line and "--no-repack" in line


def test_a_llama_server_that_dies_with_sigill_ends_the_run_in_one_line(vs, tmp_path, monkeypatch):
    monkeypatch.setattr(vs, "same_kernels", lambda model: [])
    binary = stub_tool(tmp_path, "llama-server")
    with pytest.raises(SystemExit) as ended:
        with vs.Server(str(binary), "m.gguf", 2, []):
            pass
    line = str(ended.value.code)
    assert "\n" not in line and line.startswith("llama.cpp's own llama-server died with SIGILL on this CPU")
    assert "rerun with --cpu-buffers plain" in line


def test_plain_gives_the_tools_no_repack_and_a_crash_then_says_plain_did_not_help(vs, tmp_path, monkeypatch):
    monkeypatch.setattr(vs, "CPU_BUFFERS", "plain")
    binary = stub_tool(tmp_path, "llama-batched-bench", "SEGV")
    with pytest.raises(SystemExit) as ended:
        vs.batched_bench(str(binary), "m.gguf", 2, [1])
    assert "--no-repack" in (tmp_path / "llama-batched-bench.args").read_text().split()
    line = str(ended.value.code)
    assert "died with SIGSEGV" in line and "even with --cpu-buffers plain" in line and "rerun" not in line


def test_a_tool_that_exits_with_an_error_is_one_line_with_its_last_words(vs, tmp_path, monkeypatch):
    monkeypatch.setattr(vs, "same_kernels", lambda model: [])
    binary = tmp_path / "llama-batched-bench"
    binary.write_text('#!/bin/sh\necho "loading" >&2\necho "error: failed to load model" >&2\nexit 1\n')
    binary.chmod(0o755)
    with pytest.raises(SystemExit) as ended:
        vs.batched_bench(str(binary), "m.gguf", 2, [1])
    assert ended.value.code == "llama.cpp's own llama-batched-bench exited with 1: error: failed to load model"


def test_auto_where_amx_is_built_in_but_traps_points_to_plain(vs, monkeypatch):
    # The engine takes CPU_REPACK alone there; the tools cannot, and their default layout is AMX.
    monkeypatch.setattr(vs, "cpu_extra_buffer_types", lambda: {"AMX": 0, "CPU_REPACK": 0})
    monkeypatch.setattr(vs, "engine_kernels", lambda model: KernelPath(
        "repack", False, True, "cpu_buffers=auto: AMX is built in but does not run here (the probe died with SIGILL)"))
    with pytest.raises(SystemExit) as ended:
        vs.same_kernels("m.gguf")
    line = str(ended.value.code)
    assert "\n" not in line and "does not run here" in line and "rerun with --cpu-buffers plain" in line


@pytest.mark.model
def test_the_script_prints_one_line_and_no_traceback_when_batched_bench_dies(model_path, tmp_path):
    stub_tool(tmp_path, "llama-batched-bench")
    stub_tool(tmp_path, "llama-server")
    env = {k: v for k, v in os.environ.items() if k != "LLAMABATCH_CPU_BUFFERS"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "vs_llama_server.py"), "--model", model_path,
                           "--bin", str(tmp_path), "--workloads", "", "--repeat", "1", "--batched", "1",
                           "--threads", "1", "--cpu-buffers", "plain"],
                          capture_output=True, text=True, timeout=300, env=env)
    # plain: the tools start on every CPU (auto refuses up front where AMX is listed but traps)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("llama.cpp's own llama-batched-bench died with SIGILL on this CPU"), proc.stderr
    assert "even with --cpu-buffers plain" in last
