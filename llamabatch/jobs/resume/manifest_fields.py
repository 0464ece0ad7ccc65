"""What goes into the run manifest (manifest.py writes it; docs/long-jobs.md lists every field).

At the start: versions, the model (path, name, size, sha256), every engine and sampling
setting that applies, the chat template's source, INPUT (path, size, sha256 of its first
MB), OUTPUT and the error file, the settings fingerprint, and a history entry for this
invocation. At the end: INPUT's line count, counts by finish_reason and error code and the
token totals, read back from OUTPUT and the error file (so they describe the files, over
every resume), and this invocation's wall time and generated tok/s.
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

from ...version import __version__
from ...kernel_paths.machine_verdicts import llama_cpp_version
from ...settings.resolved import Resolved
from ..reading.input_source import count_nonblank
from .fingerprint import json_safe, template_identity
from ...openai_format import record_error_code, record_id
from .manifest import FORMAT, VERSION, now_iso
from ...files.file_hash import sha256_file
from .retry_journal import whole_records

FIRST_MB = 1 << 20
# what a resume sets anew: the settings of its own invocation (the history keeps what changed)
SETTINGS_KEYS = ("llamabatch", "llama_cpp_python", "llama_cpp", "engine", "sampling", "setting_sources",
                 "chat_template", "system", "deterministic", "fingerprint", "input", "output")


def input_facts(path: str) -> dict[str, Any]:
    if path == "-":
        return {"path": "-", "size": None, "sha256_first_mb": None, "lines": None}
    try:
        size = os.path.getsize(path)
        head = sha256_file(path, limit=FIRST_MB)
    except OSError:
        size = head = None
    return {"path": os.path.abspath(path), "size": size, "sha256_first_mb": head, "lines": None}


def model_facts(path: str | None, name: str, sha256: str | None) -> dict[str, Any]:
    try:
        size = os.path.getsize(path) if path else None
    except OSError:
        size = None
    return {"path": os.path.abspath(path) if path and os.path.exists(path) else path, "name": name, "size": size,
            "sha256": sha256}


def new_manifest(*, resolved: Resolved, model: dict[str, Any], input_path: str, output: str,
                 error_file: str | None, fingerprint: dict[str, Any], system: str | None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "status": "running",
        "llamabatch": __version__,
        "llama_cpp_python": llama_cpp_version(),
        # llama-cpp-python vendors one llama.cpp commit per release: its version names llama.cpp's
        "llama_cpp": f"vendored by llama-cpp-python {llama_cpp_version()}",
        "model": model,
        "engine": json_safe(dataclasses.asdict(resolved.engine)),
        "sampling": json_safe(dataclasses.asdict(resolved.sampling)),
        "setting_sources": dict(resolved.sources),
        "chat_template": {"setting": resolved.engine.chat_template,
                          "source": template_identity(resolved.engine.chat_template)},
        "system": system,
        "deterministic": resolved.engine.deterministic,
        "input": input_facts(input_path),
        "output": {"path": os.path.abspath(output), "error_file": os.path.abspath(error_file) if error_file else None},
        "fingerprint": fingerprint,
        "started_at": now_iso(),
        "ended_at": None,
        "counts": None,
        "tokens": None,
        "wall_s": 0.0,
        "generated_tok_s": None,
        "ray": None,
        "history": [],
    }


def start_event(manifest: dict[str, Any], event: str, argv: tuple[str, ...], changed: list[str] | None = None,
                note: str | None = None) -> dict[str, Any]:
    """Append this invocation to the history: "start", "resume" or "retry-failed"; `changed`
    names settings accepted with --allow-changed-settings; `note` a manifest problem overridden."""
    entry: dict[str, Any] = {"event": event, "started_at": now_iso(), "ended_at": None, "argv": list(argv)}
    if changed is not None:
        entry["changed_settings"] = changed
    if note is not None:
        entry["overridden"] = note
    manifest.setdefault("history", []).append(entry)
    manifest["status"] = "running"
    manifest["ended_at"] = None
    return entry


def file_counts(*paths: str | None) -> tuple[dict[str, Any], dict[str, int]]:
    """Counts by finish_reason and error code, and token totals, over the records in `paths`."""
    reasons: Counter = Counter()
    codes: Counter = Counter()
    tokens = {"prompt": 0, "cached": 0, "generated": 0}
    records = 0
    for path in paths:
        if not path:
            continue
        for _raw, record in whole_records(path):
            if not isinstance(record, dict):
                continue
            records += 1
            code = record_error_code(record)
            if code:
                codes[code] += 1
            reason, usage = _reason_and_usage(record)
            reasons[reason or ("timeout" if code == "timeout" else "error")] += 1
            if isinstance(usage, dict):
                tokens["prompt"] += _int(usage.get("prompt_tokens"))
                cached = usage.get("cached_tokens")
                if cached is None and isinstance(usage.get("prompt_tokens_details"), dict):
                    cached = usage["prompt_tokens_details"].get("cached_tokens")
                tokens["cached"] += _int(cached)
                tokens["generated"] += _int(usage.get("completion_tokens"))
    counts = {"records": records, "finish_reason": dict(sorted(reasons.items())),
              "error_code": dict(sorted(codes.items()))}
    return counts, tokens


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _reason_and_usage(record: dict[str, Any]) -> tuple[str | None, Any]:
    response = record.get("response")
    if "custom_id" in record and isinstance(response, dict):  # the OpenAI Batch shape
        body = response.get("body")
        if isinstance(body, dict):
            choices = body.get("choices") or [{}]
            return choices[0].get("finish_reason"), body.get("usage")
        return None, None
    return record.get("finish_reason"), record.get("usage")


def not_in_input(input_ids: Any, *paths: str | None, shown: int = 5) -> tuple[int, list]:
    """How many records in `paths` answer an id no INPUT line has, and the first few ids."""
    count, first = 0, []
    for path in paths:
        if path:
            for _raw, record in whole_records(path):
                line_id = record_id(record)
                if line_id is not None and line_id not in input_ids:
                    count += 1
                    if len(first) < shown:
                        first.append(line_id)
    return count, first


def finish(manifest: dict[str, Any], entry: dict[str, Any], *, status: str, wall_s: float, generated: int,
           written: int, output: str, error_file: str | None, input_path: str, ray: str | None = None) -> None:
    """The end of this invocation: status ("finished", "stopped", "failed"), counts read back."""
    entry["ended_at"] = now_iso()
    entry["wall_s"] = round(wall_s, 3)
    entry["records_written"] = written
    entry["generated_tokens"] = generated
    entry["generated_tok_s"] = round(generated / wall_s, 2) if wall_s > 0 else None
    entry["status"] = status
    manifest["status"] = status
    manifest["ended_at"] = entry["ended_at"]
    if input_path != "-":
        manifest["input"]["lines"] = count_nonblank(input_path)
    manifest["counts"], manifest["tokens"] = file_counts(output, error_file)
    runs = [h for h in manifest.get("history", []) if isinstance(h.get("wall_s"), (int, float))]
    manifest["wall_s"] = round(sum(h["wall_s"] for h in runs), 3)
    made = sum(_int(h.get("generated_tokens")) for h in runs)
    manifest["generated_tok_s"] = round(made / manifest["wall_s"], 2) if manifest["wall_s"] > 0 else None
    if ray is not None:
        manifest["ray"] = ray
