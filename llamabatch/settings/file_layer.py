"""The config-file layer of option resolution (flags > env > file > defaults).

Which file applies comes from the global `--config` (kept in the command's `env.Environment`), then
$LLAMABATCH_CONFIG, then ./llamabatch.toml, then the per-user file; `config_file.py`
reads and checks it. A bad file raises ConfigFileError (an InvalidRequest), which
`app.main` turns into one line and exit 2.
"""
from __future__ import annotations

import os
from typing import Any

from .config_file import COMMAND_RULES, ConfigFile, ConfigFileError, Location, load, locate
from ...errors import InvalidRequest
from .. import env
from ..options import Resolved, SharedOptions, resolve

# A command may read the file up to twice (shared options, then its own keys): keep the
# parsed file while it is unchanged on disk.
_cache: dict[tuple[str, int, int], ConfigFile] = {}


def config_location() -> Location:
    """Which file applies now (see config_file.locate)."""
    return locate(env.current().config_path)


def current_config() -> ConfigFile | None:
    """The checked config file that applies, or None when there is none."""
    path = config_location().path
    if path is None:
        return None
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key not in _cache:
        _cache.clear()
        _cache[key] = load(path)
    return _cache[key]


def file_values_for(command: str) -> dict[str, tuple[Any, str]]:
    """Values from the config file for `command`: key -> (value, "file:line").

    Top-level engine keys and [sampling], overridden by the command's own table.
    """
    config = current_config()
    return config.values_for(command) if config else {}


def resolve_layers(opts: SharedOptions) -> Resolved:
    """Flags > env > this command's file values > defaults (see options.resolve)."""
    file_values = file_values_for(opts.command)
    try:
        return resolve(opts, file_values)
    except InvalidRequest as exc:
        # A file value fine on its own can clash with another (n_batch < n_parallel):
        # the message names the key; add where the file sets it.
        key = str(exc).split(" ", 1)[0]
        if key in file_values:
            raise ConfigFileError(f"{file_values[key][1]}: {exc}") from None
        raise


def resolve_model_layer(resolved: Resolved) -> Resolved:
    """`resolved` with its model spelling turned into a file (models.resolve_model_ref):
    aliases from the config file's [models] table, store names, folders. The display name
    stays the user's spelling; a store's default stops fill an unset `stop`."""
    from ...models.resolve import resolve_model_ref

    config = current_config()
    aliases = {name: s.value for name, s in config.models.items()} if config else {}
    ref = resolve_model_ref(resolved.engine.model, aliases, config.path if config else None)
    resolved.engine = resolved.engine.replace(model=ref.path, model_name=resolved.engine.model_name or ref.name)
    if ref.stop and not resolved.sampling.stop and resolved.sources.get("stop", "default") == "default":
        resolved.sampling = resolved.sampling.replace(stop=list(ref.stop))
        resolved.sources["stop"] = f"model ({ref.source})"
    return resolved


def command_setting(command: str, key: str, default: Any = None) -> Any:
    """A command-only key (config_file.COMMAND_RULES, e.g. run's `order`) from the
    command's table, else `default`. The caller gives its flag precedence:

        order = order_flag if order_flag is not None else command_setting("run", "order", "input")

    Raises ConfigFileError for a bad file (one line and exit 2 from `app.main`).
    """
    if key not in COMMAND_RULES.get(command, {}):
        # A programming error, not a user one: the key must be declared to be checked.
        raise KeyError(f"{command!r} has no config key {key!r}; declare it in config_file.COMMAND_RULES")
    config = current_config()
    setting = config.command_value(command, key) if config else None
    return default if setting is None else setting.value


def command_setting_source(command: str, key: str) -> str | None:
    """"file:line" where a command-only key is set, or None."""
    config = current_config()
    setting = config.command_value(command, key) if config else None
    return setting.where(config.path) if setting and config else None
