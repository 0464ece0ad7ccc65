"""The TOML config file: where it is, what it may hold, and each value's file:line.

One file is read: `--config FILE`, else $LLAMABATCH_CONFIG, else ./llamabatch.toml, else
$XDG_CONFIG_HOME/llamabatch/config.toml (~/.config by default). Layout:

    model = "~/models/qwen.gguf"      # top level: engine keys
    n_parallel = 8
    [sampling]                        # sampling defaults
    temperature = 0.2
    [run]                             # per command: overrides the two above for `run`
    n_parallel = 16
    order = "completion"              # a key only `run` knows
    [models]                          # aliases: -m fast, or model = "fast"
    fast = "ollama:gemma3:1b"

Everything is checked when the file is loaded, so a typo fails at once with one line
naming the file, the line, the key (with its table) and what is allowed — never later,
half-way through a batch. Nothing here knows about option resolution; `file_layer.py` beside it glues
it to option resolution.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from ..config import KEY_RULES as ENGINE_KEY_RULES
from ..errors import InvalidRequest
from ..params import SamplingParams
from ..checks.value_rules import Rule, boolean as _boolean, choice as _choice, integer as _integer, seconds as _seconds, text as _text
from ..files.whole_file import UnreadableFile, read_bytes

CONFIG_ENV = "LLAMABATCH_CONFIG"
LOCAL_NAME = "llamabatch.toml"
COMMANDS = ("run", "chat", "serve-stdin", "serve", "bench")
SAMPLING_TABLE = "sampling"
MODELS_TABLE = "models"
_STORE_PREFIXES = ("hf:", "ollama:", "lmstudio:")


class ConfigFileError(InvalidRequest):
    """A config file that cannot be used. An InvalidRequest, so the CLI exits 2."""


# Engine keys and their checks come from EngineConfig (its KEY_RULES), as sampling keys
# come from SamplingParams.from_dict; rules between keys (n_batch >= n_parallel, ...) are
# EngineConfig.validate's job once every layer is merged. Two EngineConfig keys are not
# top-level file keys: `seed` is a sampling key ([sampling] seed), and `max_queue` is
# serve-stdin's own (COMMAND_RULES below), as only that command has a bounded queue.
# model_name: an alias names the model; reserved_slots: serve's --online-slots sets it
_NOT_FILE_ENGINE_KEYS = ("seed", "max_queue", "model_name", "reserved_slots")
ENGINE_RULES: dict[str, Rule] = {key: rule for key, rule in ENGINE_KEY_RULES.items()
                                 if key not in _NOT_FILE_ENGINE_KEYS}

# The shared sampling keys that are not SamplingParams fields as such.
_SAMPLING_SPECIAL: dict[str, Rule] = {
    "grammar_file": _text("a path to a GBNF grammar file"),
}
SAMPLING_KEYS = tuple(f.name for f in dataclasses.fields(SamplingParams)) + tuple(_SAMPLING_SPECIAL)

# Keys only one command understands (flag > file > the command's own default). A command
# reads them with `settings.file_layer.command_setting`; adding one is one line here.
COMMAND_RULES: dict[str, dict[str, Rule]] = {
    "run": {
        "order": _choice("input", "completion"),
        "max_inflight": _integer(1, "an integer >= 1"),
        "reorder_window": _integer(0, "an integer >= 0 (0 or 1: start lines in read order)"),
        "watchdog": _seconds("a number of seconds >= 0 (0 = off)"),
        "drain_timeout": _seconds(),
        "error_file": _text("a path: failed lines' records go there instead of OUTPUT"),
    },
    "serve-stdin": {
        "max_queue": ENGINE_KEY_RULES["max_queue"],
        "on_eof": _choice("drain", "cancel"),
        "watchdog": _seconds("a number of seconds >= 0 (0 = off)"),
        "drain_timeout": _seconds(),
    },
    "chat": {
        "system": _text("a system prompt (a non-empty string)"),
        "verbose": _boolean,
    },
    "serve": {},
    "bench": {},
}

# Values that name files: relative ones are relative to the config file's folder, so a
# config in ~/.config/llamabatch can say `grammar_file = "json.gbnf"`.
_PATH_KEYS = ("model", "grammar_file", "json_schema", "chat_template")


@dataclass
class Setting:
    value: Any
    line: int
    table: str | None  # None = top level, "sampling", or a command name

    def where(self, path: str) -> str:
        return f"{path}:{self.line}"


@dataclass
class ConfigFile:
    """A loaded, checked config file."""

    path: str
    engine: dict[str, Setting] = field(default_factory=dict)
    sampling: dict[str, Setting] = field(default_factory=dict)
    commands: dict[str, dict[str, Setting]] = field(default_factory=dict)
    models: dict[str, Setting] = field(default_factory=dict)  # [models] aliases: name -> spelling

    def values_for(self, command: str | None) -> dict[str, tuple[Any, str]]:
        """Engine and sampling values for `command` (None = no command table):
        key -> (value, "file:line"). The command's table wins over the top level and [sampling]."""
        merged = {**self.engine, **self.sampling}
        if command:
            merged.update({k: s for k, s in self.commands.get(command, {}).items()
                           if k in ENGINE_RULES or k in SAMPLING_KEYS})
        return {key: (s.value, s.where(self.path)) for key, s in merged.items()}

    def command_value(self, command: str, key: str) -> Setting | None:
        """A command-only key (see COMMAND_RULES) from the command's table, or None."""
        return self.commands.get(command, {}).get(key)


@dataclass
class Location:
    """Which config file applies and how it was chosen (what `config path` reports)."""

    path: str | None  # None: no file applies
    reason: str  # "--config", "$LLAMABATCH_CONFIG", "current directory", "user config"
    looked: list[str]  # the implicit places, in order


def default_paths(cwd: str | None = None) -> list[str]:
    """The implicit places, in order: ./llamabatch.toml, then the per-user file."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return [str(Path(cwd or os.getcwd()) / LOCAL_NAME), str(base / "llamabatch" / "config.toml")]


def locate(explicit: str | None = None) -> Location:
    """The file to read. An explicit file (--config, then $LLAMABATCH_CONFIG) must exist."""
    looked = default_paths()
    for given, reason in ((explicit, "--config"), (os.environ.get(CONFIG_ENV, "").strip() or None, f"${CONFIG_ENV}")):
        if given:
            path = os.path.abspath(os.path.expanduser(given))
            if not os.path.isfile(path):
                why = "is a directory" if os.path.isdir(path) else "no such file"
                raise ConfigFileError(f"config file {path} (from {reason}): {why}")
            return Location(path, reason, looked)
    for path, reason in zip(looked, ("current directory", "user config")):
        if os.path.isfile(path):
            return Location(path, reason, looked)
    return Location(None, "", looked)


def load(path: str) -> ConfigFile:
    """Read, parse and check `path`. Raises ConfigFileError with one line."""
    try:
        raw = read_bytes(path, "config file")  # bounded (whole_file)
    except UnreadableFile as exc:
        raise ConfigFileError(f"{path}: cannot read config file ({exc.why})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return parse_text(text, path)


def parse_text(text: str, path: str = "<config>") -> ConfigFile:
    """Check TOML text as if it were the file `path` (for tests and tools)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: invalid TOML: {_one_line(exc)}") from None
    except RecursionError:  # `a = [[[[...` nested past the parser's stack
        raise ConfigFileError(f"{path}: invalid TOML: arrays or tables nested too deep") from None
    return _check(path, data, key_lines(text))


def _check(path: str, data: dict[str, Any], lines: dict[tuple[str, ...], int]) -> ConfigFile:
    config = ConfigFile(path)
    folder = os.path.dirname(os.path.abspath(path))

    def line_of(*key_path: str) -> int:
        # A key written inside an inline table or a dotted key of a parent has no line of
        # its own in the index: use the nearest enclosing one.
        for n in range(len(key_path), 0, -1):
            if key_path[:n] in lines:
                return lines[key_path[:n]]
        return 1

    def error(key_path: tuple[str, ...], message: str, table: bool = False) -> ConfigFileError:
        name = f"[{key_path[0]}]" if table else _name(key_path)
        return ConfigFileError(f"{path}:{line_of(*key_path)}: {name}: {message}")

    def take(table: str | None, key: str, value: Any, rule: Rule) -> Setting:
        key_path = (table, key) if table else (key,)
        try:
            value = rule(value)
        except InvalidRequest as exc:  # from SamplingParams' own checks: already says what is allowed
            raise error(key_path, _strip_key(str(exc), key)) from None
        except ValueError as exc:
            raise error(key_path, f"must be {exc}, got {_show(value)}") from None
        return Setting(_relative_to(folder, key, value), line_of(*key_path), table)

    for key, value in data.items():
        if key in (SAMPLING_TABLE, MODELS_TABLE) or key in COMMANDS:
            if not isinstance(value, dict):
                raise error((key,), f"must be a table ([{key}]), got {_show(value)}")
            continue
        if key in ENGINE_RULES:
            config.engine[key] = take(None, key, value, ENGINE_RULES[key])
        elif key in SAMPLING_KEYS:
            raise error((key,), f"is a sampling key: put it under [{SAMPLING_TABLE}]")
        elif isinstance(value, dict):
            raise error((key,), "unknown table; " + _allowed_top(), table=True)
        else:
            raise error((key,), "unknown key; " + _allowed_top())

    for key, value in data.get(SAMPLING_TABLE, {}).items():
        if key in SAMPLING_KEYS:
            config.sampling[key] = take(SAMPLING_TABLE, key, value, _sampling_rule(key))
        elif key in ENGINE_RULES:
            raise error((SAMPLING_TABLE, key), "is an engine key: put it at the top level, before any table")
        else:
            raise error((SAMPLING_TABLE, key), "unknown key; allowed: " + ", ".join(SAMPLING_KEYS))

    for name, value in data.get(MODELS_TABLE, {}).items():
        if not isinstance(value, str) or not value.strip():
            raise error((MODELS_TABLE, name), f"must be a model (a GGUF path, hf:ORG/REPO, ollama:NAME, "
                                             f"lmstudio:PUBLISHER/REPO or another alias), got {_show(value)}")
        config.models[name] = Setting(_model_value(folder, value.strip()), line_of(MODELS_TABLE, name), MODELS_TABLE)

    for command in COMMANDS:
        table = config.commands.setdefault(command, {})
        for key, value in data.get(command, {}).items():
            if key in ENGINE_RULES:
                rule = ENGINE_RULES[key]
            elif key in SAMPLING_KEYS:
                rule = _sampling_rule(key)
            elif key in COMMAND_RULES[command]:
                rule = COMMAND_RULES[command][key]
            else:
                own = ", ".join(COMMAND_RULES[command]) or "none"
                raise error((command, key), f"unknown key; allowed: the engine and sampling keys, and for "
                                            f"{command} only: {own}")
            table[key] = take(command, key, value, rule)
    return config


def _sampling_rule(key: str) -> Rule:
    if key in _SAMPLING_SPECIAL:
        return _SAMPLING_SPECIAL[key]

    def check(value: Any) -> Any:
        if key == "json_schema" and isinstance(value, dict):
            # An inline TOML table is the schema itself; the CLI takes schemas as JSON text.
            SamplingParams.from_dict({key: value})
            return json.dumps(value)
        if key == "json_schema":
            return _text("a JSON schema: inline JSON text, a file, or a TOML table")(value)
        # SamplingParams owns the types and ranges of its fields; reuse its checks.
        checked = SamplingParams.from_dict({key: value})
        return getattr(checked, key)
    return check


def _relative_to(folder: str, key: str, value: Any) -> Any:
    if key not in _PATH_KEYS or not isinstance(value, str):
        return value
    if key == "json_schema" and value.lstrip().startswith("{"):
        return value  # inline JSON, not a file
    if key == "model":
        return _model_value(folder, value)
    if key == "chat_template" and "/" not in value and not os.path.exists(os.path.join(folder, value)):
        return value  # a built-in name (chatml, granite-4.0, ...), not a file beside the config
    expanded = os.path.expanduser(value)
    return expanded if os.path.isabs(expanded) else os.path.normpath(os.path.join(folder, expanded))


def _model_value(folder: str, value: str) -> str:
    """A model value as written, with a relative path made relative to the config's folder.
    Store names and aliases (a bare word with no file of that name beside the config) stay."""
    if value.startswith(_STORE_PREFIXES):
        return value
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    beside = os.path.join(folder, expanded)
    if "/" in value or value.lower().endswith(".gguf") or os.path.exists(beside):
        return os.path.normpath(beside)
    head, sep, quant = value.rpartition(":")
    if sep and head and os.path.isdir(os.path.join(folder, head)):  # FOLDER:QUANT beside the config
        return os.path.normpath(os.path.join(folder, head)) + ":" + quant
    return value


def _allowed_top() -> str:
    return ("allowed at the top level: " + ", ".join(ENGINE_RULES) + "; tables: "
            + ", ".join(f"[{t}]" for t in (SAMPLING_TABLE, MODELS_TABLE, *COMMANDS)))


def _name(key_path: tuple[str, ...]) -> str:
    if len(key_path) == 1:
        return f"[{key_path[0]}]" if key_path[0] in (SAMPLING_TABLE, MODELS_TABLE, *COMMANDS) else key_path[0]
    return f"[{key_path[0]}] {'.'.join(key_path[1:])}"


def _strip_key(message: str, key: str) -> str:
    # SamplingParams says "top_p must be ..."; the key is already named in front.
    return message[len(key) + 1:] if message.startswith(key + " ") else message


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


# --- where each key is written ------------------------------------------------------
# tomllib keeps no positions, so the lines are found by scanning the text: table headers
# and `key =` lines, skipping the insides of multi-line strings.

_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})(?:\s*\.\s*(?:{_BARE}|{_QUOTED}))*"
_HEADER_RE = re.compile(rf"^\s*\[\[?\s*({_KEY})\s*\]\]?")
_ASSIGN_RE = re.compile(rf"^\s*({_KEY})\s*=")
_PART_RE = re.compile(rf"{_BARE}|{_QUOTED}")


def _parts(dotted: str) -> tuple[str, ...]:
    out = []
    for part in _PART_RE.findall(dotted):
        if part.startswith('"'):
            part = json.loads(part)
        elif part.startswith("'"):
            part = part[1:-1]
        out.append(part)
    return tuple(out)


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """(table..., key) -> 1-based line where it is set; tables map to their header line."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    closing: str | None = None  # the delimiter ending the multi-line string we are in
    for number, line in enumerate(text.splitlines(), start=1):
        if closing:
            if closing in line:
                closing = None
            continue
        header = _HEADER_RE.match(line)
        if header:
            table = _parts(header.group(1))
            lines.setdefault(table, number)
            continue
        assign = _ASSIGN_RE.match(line)
        if not assign:
            continue
        key = table + _parts(assign.group(1))
        for n in range(len(table) + 1, len(key) + 1):
            lines.setdefault(key[:n], number)
        rest = line[assign.end():]
        for delim in ('"""', "'''"):
            if rest.count(delim) % 2 == 1:  # opened, not closed on this line
                closing = delim
                break
    return lines
