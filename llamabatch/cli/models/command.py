"""`llamabatch models [--json]`: list every model in the stores, from GGUF headers only."""
from __future__ import annotations

import json
from typing import Any

import typer

from ..env import Environment
from ..engine_options import environment_of


def models_command(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per model on stdout instead of a table."),
) -> None:
    """List the GGUF models already on disk: the Hugging Face cache, llama.cpp's -hf cache, Ollama, LM Studio,
    the bundled model and the config file's \\[models] aliases.

    NAME is what to pass to -m / --model. Only GGUF headers are read: no model is loaded.
    """
    from ...models.model_list import list_models, places
    from ...settings.file_layer import current_config

    env = environment_of(ctx)
    config = current_config(env.config_path)
    aliases = {name: s.value for name, s in config.models.items()} if config else {}
    rows = list_models(aliases, config.path if config else None)
    stdout = env.stdout
    if as_json:
        for row in rows:
            stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
        stdout.flush()
    elif rows:
        _table(rows, env)
    if not any(row["source"] not in ("bundled", "package", "alias") for row in rows):
        env.say("llamabatch: no models in the stores; looked in " + ", ".join(f"{s} {d}" for s, d in places()))


def _table(rows: list[dict[str, Any]], env: Environment) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("SOURCE", "NAME (-m)", "SIZE", "ARCH", "QUANT", "CONTEXT", "TEMPLATE"):
        table.add_column(column, justify="right" if column in ("SIZE", "CONTEXT") else "left", no_wrap=True)
    for row in rows:
        if row["error"]:
            table.add_row(row["source"], escape(row["name"]), _size(row["size"]), f"[red]{escape(row['error'])}[/red]",
                          "", "", "")
            continue
        table.add_row(row["source"], escape(row["name"]), _size(row["size"]), row["architecture"] or "?",
                      row["quantization"] or "?", f"{row['context_length']:,}" if row["context_length"] else "?",
                      "yes" if row["chat_template"] else "no")
    # Piped, the table keeps its natural width rather than being squeezed to 80 columns.
    Console(file=env.stdout, width=None if env.stdout_isatty else 400).print(table)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
