"""Verdicts measured once per machine (does AMX run here? is deterministic mode invariant
here?), kept in llamabatch's cache folder so the next process does not measure again.

A verdict is only reused on the same machine and software: the key holds the CPU's model
name and feature flags, the llama-cpp-python version, and whatever the caller adds (model
file, kernel path). A verdict from another llama-cpp-python version or CPU is never reused.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
from importlib import metadata
from pathlib import Path

from ..files.replaced_file import replacing

log = logging.getLogger("llamabatch.machine_verdicts")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first CPU's /proc/cpuinfo fields (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """`arch model-name`, for people and for cache keys (autoslots)."""
    return f"{platform.machine()} {_cpuinfo().get('model name') or platform.processor()}"


def cpu_identity() -> str:
    """`arch model-name flags=<hash>`: what decides which kernels llama.cpp can run."""
    flags = _cpuinfo().get("flags") or _cpuinfo().get("Features") or ""  # x86 / ARM
    return f"{cpu_name()} flags={hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def llama_cpp_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def model_identity(model_path: str) -> str:
    """File name, size and mtime: enough to tell one model file from another without hashing it."""
    try:
        st = os.stat(model_path)
        return f"{os.path.basename(model_path)}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        return os.path.basename(model_path)


def verdict_key(*parts: str) -> str:
    return "|".join([f"llama-cpp-python={llama_cpp_version()}", cpu_identity(), *parts])


def verdicts_path() -> Path:
    """verdicts.json in llamabatch's cache folder ($LLAMABATCH_CACHE_DIR, else the XDG cache dir)."""
    from ..files.cache_folder import cache_dir

    return cache_dir() / "verdicts.json"


def read_verdict(key: str) -> dict | None:
    try:
        entry = json.loads(verdicts_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("ok"), bool) else None


def write_verdict(key: str, ok: bool, why: str) -> None:
    """Best effort: a cache that cannot be written only means measuring again next time."""
    path = verdicts_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            data = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            data = {}
        data[key] = {"ok": ok, "why": why}
        with replacing(path) as tmp:
            Path(tmp).write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError as exc:
        log.debug("could not write %s: %s", path, exc)
