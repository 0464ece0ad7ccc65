"""`llamabatch report OUTPUT [--json]`: the run manifest beside OUTPUT, for people (a rich
table on stdout) or programs (--json: the manifest itself)."""
from __future__ import annotations

import json
from typing import Any

import typer

from ..engine_options import environment_of


def report_command(
    ctx: typer.Context,
    output: str = typer.Argument(..., metavar="OUTPUT", show_default=False,
                                 help="A results file of `llamabatch run` (or its .manifest.json)."),
    as_json: bool = typer.Option(False, "--json", help="The manifest as JSON on stdout."),
) -> None:
    """Show what produced OUTPUT: model, settings, versions, counts, speed (its run manifest)."""
    show_report(output, as_json, environment_of(ctx).stdout)


def show_report(output: str, as_json: bool, stdout: Any) -> None:
    from ...jobs.resume.manifest import manifest_path, read_manifest, SUFFIX  # the jobs package: only when run

    path = output if output.endswith(SUFFIX) else manifest_path(output)
    manifest = read_manifest(path)  # ManifestProblem, a JobFileError: one line, exit 1
    if as_json:
        print(json.dumps(manifest, ensure_ascii=False, indent=2), file=stdout, flush=True)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"llamabatch run: {output}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in rows(manifest):
        table.add_row(key, value)
    Console(file=stdout, highlight=False, width=120).print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


def rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    model = m.get("model") or {}
    inp = m.get("input") or {}
    counts = m.get("counts") or {}
    tokens = m.get("tokens") or {}
    history = m.get("history") or []
    out_rows = [
        ("status", _fmt(m.get("status"))),
        ("model", f"{model.get('name')} ({model.get('path')}, {model.get('size')} bytes)"),
        ("model sha256", _fmt(model.get("sha256"))),
        ("chat template", _fmt((m.get("chat_template") or {}).get("source"))),
        ("deterministic", _fmt(m.get("deterministic"))),
        ("versions", f"llamabatch {m.get('llamabatch')}, llama-cpp-python {m.get('llama_cpp_python')}"),
        ("input", f"{inp.get('path')} ({inp.get('size')} bytes, {inp.get('lines')} lines, "
                  f"first MB sha256 {str(inp.get('sha256_first_mb'))[:12]})"),
        ("output", _fmt((m.get("output") or {}).get("path"))),
        ("error file", _fmt((m.get("output") or {}).get("error_file"))),
        ("started / ended", f"{m.get('started_at')} / {m.get('ended_at') or '-'}"),
        ("records", _fmt(counts.get("records"))),
        ("finish reasons", _fmt(counts.get("finish_reason"))),
        ("error codes", _fmt(counts.get("error_code"))),
        ("tokens", f"prompt {tokens.get('prompt')}, cached {tokens.get('cached')}, generated {tokens.get('generated')}"),
        ("wall time", f"{m.get('wall_s')} s, {m.get('generated_tok_s')} generated tok/s"),
        ("sampling", ", ".join(f"{k}={v}" for k, v in (m.get("sampling") or {}).items()
                               if k in ("max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop"))),
    ]
    if m.get("ray"):
        out_rows.append(("ray", _fmt(m["ray"])))
    for i, h in enumerate(history, 1):
        changed = h.get("changed_settings")
        extra = f"; changed: {'; '.join(changed)}" if changed else ""
        if h.get("overridden"):
            extra += f"; overridden: {h['overridden']}"
        out_rows.append((f"run {i}", f"{h.get('event')} {h.get('started_at')}, {h.get('status', 'running')}, "
                                     f"{h.get('records_written', '-')} record(s){extra}"))
    return out_rows
