"""The settings fingerprint: what changes the answers a run writes, compared on --resume.

A resume with another model, template, system prompt or sampling settings would mix two
experiments in one OUTPUT without a trace. The fingerprint is stored in the manifest; a
resume compares it with the settings it was given and names every difference, old → new.

In it: the model by content (sha256), the chat template (its name, or a Jinja file's
sha256), --system, a table's prompt template and id column, every sampling default except `timeout` (it bounds how long a line may
take, not what it says: raising it is how one retries timeouts), the engine-wide seed,
deterministic mode, and llamabatch's major version.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ...version import __version__
from ...settings.resolved import Resolved
from ...files.file_hash import sha256_file

NOT_IN_FINGERPRINT = ("timeout",)


def json_safe(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples as lists, int keys as strings)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def template_identity(choice: str | None) -> str:
    """"gguf" (the model's own, covered by its sha256), a built-in name, or file:<sha256>."""
    if not choice:
        return "gguf"
    if os.path.isfile(choice):
        try:
            return f"file:{sha256_file(choice)}"
        except OSError:
            return f"file:{choice}"
    return choice


def fingerprint(resolved: Resolved, model_sha256: str | None, system: str | None,
                table: dict[str, Any] | None = None) -> dict[str, Any]:
    """`table`: how a table INPUT's rows become prompts and ids (its template, messages template
    and id column); left out for prompts files, so their manifests read as before."""
    sampling = {k: v for k, v in dataclasses.asdict(resolved.sampling).items() if k not in NOT_IN_FINGERPRINT}
    return json_safe({
        **({"table": table} if table is not None else {}),
        "model_sha256": model_sha256,
        "chat_template": template_identity(resolved.engine.chat_template),
        "system": system,
        "sampling": sampling,
        "seed": resolved.engine.seed,
        "deterministic": resolved.engine.deterministic,
        "llamabatch_major": int(__version__.split(".")[0]),
    })


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and (not prefix or prefix in ("sampling", "table")):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256: the first 12 digits tell them apart
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each setting that differs, as "name: old → new" (names like sampling.temperature)."""
    a, b = _flat(json_safe(old)), _flat(json_safe(new))
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, missing), b.get(key, missing)
        if x != y:
            out.append(f"{key}: {'(unset)' if x is missing else _show(x)} → {'(unset)' if y is missing else _show(y)}")
    return out
