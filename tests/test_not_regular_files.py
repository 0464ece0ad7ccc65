"""GGUF candidates that are not regular files: a FIFO named *.gguf
used to hang `llamabatch models` (in a scanned store) and `run -m x.gguf`, because open()
on a FIFO waits for a writer. Each call here runs in a thread with a deadline, so a
regression fails the test instead of hanging the suite. No model is loaded."""
from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

import pytest

from cli_harness import invoke
from llamabatch.errors import ModelLoadError
from llamabatch.models.gguf_header import GGUFError, read_header
from llamabatch.models.model_list import list_models
from llamabatch.models.stores import model_files
from llamabatch.models.gguf_header import check_gguf

DEADLINE_S = 20


def finishes(fn):
    """fn()'s value, or a test failure if it has not returned within DEADLINE_S."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test thread below
            box["error"] = exc

    thread = threading.Thread(target=call, daemon=True)  # a hung open() must not keep pytest alive
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"still blocked after {DEADLINE_S} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def tiny_gguf(path: Path) -> Path:
    """A GGUF v3 header with one key and no tensors: enough for the header reader."""
    key, value = b"general.architecture", b"llama"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IQ", 8, len(value)) + value)
    return path


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_header_reader_refuses_a_fifo_without_blocking(tmp_path):
    pipe = fifo(tmp_path / "x.gguf")
    with pytest.raises(GGUFError) as info:
        finishes(lambda: read_header(str(pipe)))
    assert str(info.value) == f"{pipe}: is a FIFO (named pipe), not a regular file"


def test_check_gguf_refuses_a_fifo_and_a_socket_in_one_line(tmp_path):
    pipe = fifo(tmp_path / "x.gguf")
    with pytest.raises(ModelLoadError) as info:
        finishes(lambda: check_gguf(str(pipe)))
    assert str(info.value) == f"{pipe}: is a FIFO (named pipe), not a regular file"
    # AF_UNIX paths are short: bind in a short temp dir rather than pytest's deep one
    sock_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"lb-{os.getpid()}.gguf"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(sock_path))
        with pytest.raises(ModelLoadError, match="is a socket, not a regular file"):
            finishes(lambda: check_gguf(str(sock_path)))
    finally:
        server.close()
        sock_path.unlink(missing_ok=True)


def test_a_device_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="/dev/zero: is a character device, not a regular file"):
        finishes(lambda: check_gguf("/dev/zero"))


def test_folder_scan_skips_a_fifo_named_gguf(tmp_path):
    good = tiny_gguf(tmp_path / "models" / "good.gguf")
    fifo(tmp_path / "models" / "x.gguf")
    assert model_files(tmp_path / "models") == [good]


def test_models_listing_skips_a_fifo_in_a_store(tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "LLAMA_CACHE", "OLLAMA_MODELS", "LLAMABATCH_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))  # no bundled model in the listing
    snapshot = tmp_path / "hf" / "hub" / "models--acme--tiny-GGUF" / "snapshots" / "abc"
    tiny_gguf(snapshot / "tiny-Q4_K_M.gguf")
    fifo(snapshot / "tiny-Q8_0.gguf")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc")
    rows = [r for r in finishes(list_models) if r["source"] != "package"]  # the stores, not installed smollm2
    assert [(r["name"], r["error"]) for r in rows] == [("hf:acme/tiny-GGUF", None)]
    # a FIFO where the hub keeps its ref is passed over too (the newest snapshot is used)
    (snapshot.parent.parent / "refs" / "main").unlink()
    fifo(snapshot.parent.parent / "refs" / "main")
    assert [r["name"] for r in finishes(list_models) if r["source"] != "package"] == ["hf:acme/tiny-GGUF"]


def test_run_with_a_fifo_as_model_is_one_line_exit_1(tmp_path):
    pipe = fifo(tmp_path / "x.gguf")
    inp = tmp_path / "in.txt"
    inp.write_text("hi\n")
    for slots in ("auto", "2"):  # auto resolves the model before measuring; a number in the engine
        result = finishes(lambda: invoke(["run", str(inp), "-m", str(pipe), "--n-parallel", slots,
                                          "-o", str(tmp_path / "out.jsonl")]))
        assert result.exit_code == 1
        assert result.stderr.strip().splitlines() == [
            f"llamabatch: error: {pipe}: is a FIFO (named pipe), not a regular file"]
