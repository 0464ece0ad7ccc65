"""Test helpers: copy a real GGUF with some string metadata changed, and build fake model stores.

`with_metadata` rewrites the key-value section and copies the tensor infos and data as they
are (padded to the file's alignment), so the copy still loads in llama.cpp: a Gemma 3 270M
that says it is "Mistral 7B Instruct" is how the tests reach the Mistral format end to end
without a Mistral download.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from llamabatch.models.gguf_header import STRING, _Reader, read_header


def _kv_spans(path: str) -> tuple[bytes, list[tuple[str, bytes]], int]:
    """(magic+version+tensor count bytes, [(key, raw kv bytes)], offset after the kv section)."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the key-value section of any test model is far smaller
    reader = _Reader(memoryview(data), path)
    reader.pos = 8
    reader.take("<Q", 8)
    n_kv = reader.take("<Q", 8)
    spans = []
    for _ in range(n_kv):
        start = reader.pos
        key = reader.string()
        reader.value(reader.take("<I", 4))
        spans.append((key, data[start:reader.pos]))
    return data[:16], spans, reader.pos


def _string_kv(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", STRING) + struct.pack("<Q", len(v)) + v


def with_metadata(src: str, dst: Path, strings: dict[str, str | None]) -> Path:
    """Copy the GGUF `src` to `dst`, setting (or, with None, removing) string keys."""
    header = read_header(src)
    head, spans, kv_end = _kv_spans(src)
    kept = [raw for key, raw in spans if key not in strings]
    added = [_string_kv(k, v) for k, v in strings.items() if v is not None]
    alignment = header.get("general.alignment", 32)
    with open(src, "rb") as f:
        f.seek(kv_end)
        reader_data = f.read(64 << 20)  # tensor infos are far smaller than this
    reader = _Reader(memoryview(reader_data), src)
    for _ in range(header.tensor_count):
        reader.string()
        n_dims = reader.take("<I", 4)
        reader.pos += 8 * n_dims + 4 + 8
    infos = reader_data[:reader.pos]
    old_data_start = _align(kv_end + reader.pos, alignment)
    out = head + struct.pack("<Q", len(kept) + len(added)) + b"".join(kept) + b"".join(added) + infos
    out += b"\0" * (_align(len(out), alignment) - len(out))
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(out)
        fin.seek(old_data_start)
        shutil.copyfileobj(fin, fout, 1 << 22)
    return dst


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# --- fake stores ---------------------------------------------------------------------------


def link(target: str, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def hf_repo(hub: Path, repo: str, files: list[str], model: str, revision: str = "0123abcd") -> Path:
    """A hub-cache repo: refs/main -> snapshots/REV/FILE (symlinks, as huggingface_hub makes them)."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(revision)
    for name in files:
        link(model, repo_dir / "snapshots" / revision / name)
    return repo_dir


def ollama_model(root: Path, name: str, tag: str, model: str, stop: list[str] | None = None,
                 namespace: str = "library", host: str = "registry.ollama.ai") -> Path:
    """An Ollama store entry: manifest -> model layer blob (a link to `model`) and a params layer."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = "sha256:" + (name + tag).encode().hex().ljust(64, "0")[:64]
    link(model, blobs / digest.replace(":", "-"))
    layers = [{"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1}]
    if stop is not None:
        params_digest = "sha256:" + ("p" + name + tag).encode().hex().ljust(64, "0")[:64]
        (blobs / params_digest.replace(":", "-")).write_text(json.dumps({"stop": stop, "temperature": 1}))
        layers.append({"mediaType": "application/vnd.ollama.image.params", "digest": params_digest, "size": 1})
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return manifest
