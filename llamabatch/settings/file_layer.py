"""The config-file layer of settings resolution (flags > env > file > defaults).

Which file applies comes from the global `--config` (the command's Environment passes it
here as `config_path`), then $LLAMABATCH_CONFIG, then ./llamabatch.toml, then the per-user
file; `config_file.py` reads and checks it. A bad file raises ConfigFileError (an
InvalidRequest), which the CLI turns into one line and exit 2.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..errors import InvalidRequest
from .config_file import COMMAND_RULES, ConfigFile, ConfigFileError, Location, load, locate
from .layers import merge
from .ready import choose_model
from .resolved import Resolved

# A command may read the file more than once (shared options, then its own keys): keep the
# parsed file while it is unchanged on disk.
_cache: dict[tuple[str, int, int], ConfigFile] = {}


def config_location(config_path: str | None = None) -> Location:
    """Which file applies now (see config_file.locate); `config_path` is --config's value."""
    return locate(config_path)


def current_config(config_path: str | None = None) -> ConfigFile | None:
    """The checked config file that applies, or None when there is none."""
    path = config_location(config_path).path
    if path is None:
        return None
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key not in _cache:
        _cache.clear()
        _cache[key] = load(path)
    return _cache[key]


def file_values_for(command: str, config_path: str | None = None) -> dict[str, tuple[Any, str]]:
    """Values from the config file for `command`: key -> (value, "file:line").

    Top-level engine keys and [sampling], overridden by the command's own table.
    """
    config = current_config(config_path)
    return config.values_for(command) if config else {}


def resolve_layers(flags: Mapping[str, Any], command: str = "", config_path: str | None = None) -> Resolved:
    """Flags > env > this command's file values > defaults (layers.merge); the model is
    still the user's spelling (`config show` prints it as given)."""
    return _layers(flags, command, current_config(config_path))


def _layers(flags: Mapping[str, Any], command: str, config: ConfigFile | None) -> Resolved:
    file_values = config.values_for(command) if config else {}
    try:
        return merge(flags, command, file_values)
    except InvalidRequest as exc:
        # A file value fine on its own can clash with another (n_batch < n_parallel):
        # the message names the key; add where the file sets it.
        key = str(exc).split(" ", 1)[0]
        if key in file_values:
            raise ConfigFileError(f"{file_values[key][1]}: {exc}") from None
        raise


def resolve_settings(flags: Mapping[str, Any], command: str = "", config_path: str | None = None) -> Resolved:
    """What a command runs with: every layer merged (resolve_layers), then the model named
    by them resolved, aliases from the file's [models] table included (ready.choose_model).
    Bad values raise InvalidRequest (exit 2); an unknown model name ModelLoadError (exit 1)."""
    config = current_config(config_path)
    return _with_model(_layers(flags, command, config), config)


def _with_model(layered: Resolved, config: ConfigFile | None) -> Resolved:
    aliases = {name: s.value for name, s in config.models.items()} if config else {}
    return choose_model(layered, aliases, config.path if config else None)


def resolve_command_settings(flags: Mapping[str, Any], command: str, config_path: str | None = None,
                             notice: Callable[[str], None] = lambda _line: None) -> Resolved:
    """What `command` runs with (resolve_settings), where a model named by no layer is the
    command's own default: for run, serve-stdin and chat the chat-tuned one when installed
    (models.default_model; `notice` gets one line when it is not). The layers are merged and
    checked once, the config file read once; the default stands where a flag naming it would."""
    return _command_resolved(flags, command, current_config(config_path), notice)


def resolve_command(flags: Mapping[str, Any], command: str, own_keys: tuple[str, ...], config_path: str | None = None,
                    notice: Callable[[str], None] = lambda _line: None) -> tuple[Resolved, dict[str, Any]]:
    """Everything `command` reads from its layers, the config file read once: what it runs with
    (resolve_command_settings) and its own keys from its table (command_settings: key -> value,
    or None where the file does not set it)."""
    config = current_config(config_path)
    return _command_resolved(flags, command, config, notice), _command_keys(command, own_keys, config)


def _command_resolved(flags: Mapping[str, Any], command: str, config: ConfigFile | None,
                      notice: Callable[[str], None]) -> Resolved:
    from ..models.default_model import default_model

    layered = _layers(flags, command, config)
    default = default_model(command, notice) if layered.sources.get("model") == "default" else None
    if default is not None:
        layered = layered.replace(engine=layered.engine.replace(model=default))
        layered.sources["model"] = "default (chat-tuned)"
    return _with_model(layered, config)


def command_setting(command: str, key: str, default: Any = None, config_path: str | None = None) -> Any:
    """A command-only key (config_file.COMMAND_RULES, e.g. run's `order`) from the
    command's table, else `default`. The caller gives its flag precedence:

        order = order_flag if order_flag is not None else command_setting("run", "order", "input", path)

    Raises ConfigFileError for a bad file (one line and exit 2 from the CLI).
    """
    value = command_settings(command, (key,), config_path)[key]
    return default if value is None else value


def command_settings(command: str, keys: tuple[str, ...], config_path: str | None = None) -> dict[str, Any]:
    """Several command-only keys at once, the file located and read once: key -> its value
    from the command's table, or None. Raises ConfigFileError for a bad file."""
    return _command_keys(command, keys, current_config(config_path) if keys else None)


def _command_keys(command: str, keys: tuple[str, ...], config: ConfigFile | None) -> dict[str, Any]:
    undeclared = [key for key in keys if key not in COMMAND_RULES.get(command, {})]
    if undeclared:
        # A programming error, not a user one: the key must be declared to be checked.
        raise KeyError(f"{command!r} has no config key {undeclared[0]!r}; declare it in config_file.COMMAND_RULES")
    settings = {key: config.command_value(command, key) if config else None for key in keys}
    return {key: None if setting is None else setting.value for key, setting in settings.items()}


def command_setting_source(command: str, key: str, config_path: str | None = None) -> str | None:
    """"file:line" where a command-only key is set, or None."""
    config = current_config(config_path)
    setting = config.command_value(command, key) if config else None
    return setting.where(config.path) if setting and config else None
