"""The settings in effect, as `llamabatch config show` reports them: one (key, value, source)
row per setting, the source being flag, env NAME, file:line or default, and each value in words."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from .config_file import ENGINE_RULES
from .config_file import SAMPLING_KEYS as FILE_SAMPLING_KEYS
from .file_layer import current_config
from .layers import SHARED_KEYS, env_name
from .resolved import Resolved

Row = tuple[str, Any, str]

# What a None default means, in words.
_UNSET = {
    "model": "(bundled Gemma 3 270M)",
    "chat_template": "(the model's own)",
    "seed": "(random per request)",
}
_WIDEST_VALUE = 60


def setting_rows(resolved: Resolved, given: Mapping[str, Any], file_values: dict[str, tuple[Any, str]]) -> list[Row]:
    """Every resolved setting; `given`: the values given as flags (None = not given)."""
    rows = []
    for key, source in resolved.sources.items():
        if key in ENGINE_RULES:
            value = getattr(resolved.engine, key)
        elif key in ("grammar_file", "json_schema"):
            value = _given(key, source, given, file_values)  # the path or text given, not what was read from it
        else:
            value = getattr(resolved.sampling, key)
        rows.append((key, value, source))
    order = {key: i for i, key in enumerate(SHARED_KEYS)}
    rows.sort(key=lambda row: order.get(row[0], len(order)))  # shared keys first, then file-only sampling keys
    return rows


def _given(key: str, source: str, given: Mapping[str, Any], file_values: dict[str, tuple[Any, str]]) -> Any:
    if source == "flag":
        return given.get(key)
    if source.startswith("env "):
        return os.environ.get(env_name(key))
    if source == "default":
        return None
    return file_values[key][0]


def command_rows(command: str | None, config_path: str | None) -> list[Row]:
    """A command's own keys, where the file sets them (their defaults live in the command)."""
    config = current_config(config_path)
    if not command or config is None:
        return []
    return [(key, setting.value, setting.where(config.path))
            for key, setting in config.commands.get(command, {}).items()
            if key not in ENGINE_RULES and key not in FILE_SAMPLING_KEYS]


def value_text(key: str, value: Any, resolved: Resolved) -> str:
    """A value as one short line: None in words, JSON for lists and objects, cut at 60 characters."""
    if value is None:
        if key == "n_ctx":
            return f"(auto: {resolved.engine.total_ctx}; run sizes it from INPUT)"
        if key == "threads":
            return f"(auto: {resolved.engine.n_threads})"
        return _UNSET.get(key, "(none)")
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= _WIDEST_VALUE else text[: _WIDEST_VALUE - 1] + "…"
