"""Flag > LLAMABATCH_* environment > config file > built-in default, for every shared key.

`merge` takes the flags as given (None = not given), the config file's values for the
command, and the command's name (a few built-in defaults differ per command), and returns
a Resolved: the EngineConfig, the default SamplingParams, and where each value came from.
The model is still the user's spelling here (ready.choose_model resolves it).
"""
from __future__ import annotations

import os
from dataclasses import fields
from typing import Any, Mapping

from ..config import EngineConfig
from ..errors import InvalidRequest
from ..files.json_line import BadJSON, loads
from ..params import SamplingParams
from ..files.whole_file import read_json, read_text
from .config_file import ENGINE_RULES
from .resolved import Resolved

ENGINE_KEYS = tuple(ENGINE_RULES)  # EngineConfig's keys a flag, env variable or config file sets
SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "stop",
                 "grammar_file", "json_schema", "reasoning_budget")
# Every key a flag sets (cli/engine_options.py declares one flag per key, in this order).
SHARED_KEYS = ("model", "n_parallel", "n_ctx", "n_batch", "chunk_size", "threads", "policy", "cache_prompt",
               "n_gpu_layers", "chat_template", "deterministic", "cpu_buffers", "kv_unified", "slot_moves", "max_memory",
               "pooling", "prefix_store", "prefix_store_max_bytes", "grammar_backend", "speculative", "cache_type_k", "cache_type_v", "flash_attn") + SAMPLING_KEYS

# Built-in defaults that differ for one command, below every other layer. One conversation
# needs one slot, which then gets all of --n-ctx.
def default_store_folder() -> str:
    """Where the commands keep the disk prefix store unless told otherwise."""
    from ..files.cache_folder import cache_dir

    return str(cache_dir() / "prefix-store")


# The disk prefix store is on for the commands that serve many or long prompts (a callable
# default is read when the command runs: the cache folder follows the environment); bench
# measures evaluation, and the library opens none unless asked.
# serve opens one KV cache shared by its slots, as llama-server does when it picks its slots
# itself: online requests beside a batch cost the batch less (docs/performance.md, "The KV
# layout beside online traffic"), and one online request may take up to the model's context
# from the pool while `run` can size its cache from its file first. Deterministic mode keeps
# a stream per slot (its row rule needs one), so there the default does not apply.
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat": {"n_parallel": 1, "prefix_store": default_store_folder},
    "run": {"n_parallel": "auto", "prefix_store": default_store_folder},
    "serve-stdin": {"n_parallel": "auto", "prefix_store": default_store_folder},
    "serve": {"n_parallel": "auto", "prefix_store": default_store_folder, "kv_unified": True},
}


def env_name(key: str) -> str:
    return "LLAMABATCH_" + key.upper()


def _from_env(key: str, kind: Any, environ: Mapping[str, str]) -> Any:
    raw = environ.get(env_name(key))
    if raw is None or raw == "":
        return None
    try:
        if kind is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        if kind == "list":
            return [s for s in raw.split(",") if s]
        if kind == "slots":
            return parse_slots(raw.strip(), env_name(key))
        return raw
    except ValueError:
        raise InvalidRequest(f"{env_name(key)}={raw!r} is not a valid {getattr(kind, '__name__', kind)}") from None


def parse_slots(value: Any, where: str = "--n-parallel") -> int | str:
    """An explicit slot count or "auto" (from a flag or the environment, both text)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidRequest(f"{where} must be an integer >= 1 or auto, got {value!r}") from None


def _kind(key: str) -> Any:
    if key == "stop":
        return "list"
    if key == "n_parallel":
        return "slots"
    if key in ("max_memory", "prefix_store_max_bytes", "n_ctx"):  # "16GiB", "80%", "off", "auto" or a number: the setting's rule reads the text
        return str
    if key in ("cache_prompt", "deterministic", "kv_unified", "slot_moves"):
        return bool
    defaults = {f.name: f.type for f in fields(EngineConfig)} | {f.name: f.type for f in fields(SamplingParams)}
    t = str(defaults.get(key, "str"))
    return int if t.startswith("int") else float if t.startswith("float") else str


def merge(flags: Mapping[str, Any], command: str = "", file_values: Mapping[str, tuple[Any, str]] | None = None,
          environ: Mapping[str, str] | None = None) -> Resolved:
    """Merge the layers for every shared key: flag > env > config file > default.
    `file_values`: key -> (value, "file:line"); `environ` defaults to os.environ."""
    file_values = file_values or {}
    environ = os.environ if environ is None else environ
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in SHARED_KEYS:
        flag = flags.get(key)
        if key == "n_parallel" and flag is not None:
            flag = parse_slots(flag)
        if flag is not None:
            chosen[key], sources[key] = flag, "flag"
            continue
        env = _from_env(key, _kind(key), environ)
        if env is not None:
            chosen[key], sources[key] = env, f"env {env_name(key)}"
        elif key in file_values:
            chosen[key], sources[key] = file_values[key]
        elif key == "kv_unified" and chosen.get("deterministic"):
            sources[key] = "default"  # deterministic mode needs a stream per slot (COMMAND_DEFAULTS)
        elif key in COMMAND_DEFAULTS.get(command, {}):
            default = COMMAND_DEFAULTS[command][key]
            chosen[key], sources[key] = default() if callable(default) else default, f"default ({command})"
        else:
            sources[key] = "default"
    engine = EngineConfig.from_dict({k: chosen[k] for k in ENGINE_KEYS if k in chosen})
    sampling_values = {k: chosen[k] for k in SAMPLING_KEYS if k in chosen and k not in ("grammar_file", "json_schema")}
    # Sampling fields without a flag (presence_penalty, timeout, ...) can come from the config file only.
    extra = {k: v for k, v in file_values.items() if k not in SHARED_KEYS}
    sources.update({k: where for k, (_, where) in extra.items()})
    sampling_values = {k: v for k, (v, _) in extra.items()} | sampling_values
    if "grammar_file" in chosen:
        # bounded, UTF-8, one line when not (UnreadableFile is an InvalidRequest: exit 2)
        sampling_values["grammar"] = read_text(chosen["grammar_file"], "--grammar-file")
    if "json_schema" in chosen:
        sampling_values["json_schema"] = _json_schema(chosen["json_schema"])
    sampling = SamplingParams.from_dict(sampling_values)
    return Resolved(engine, sampling, sources)


def _json_schema(value: str) -> dict:
    if value.lstrip().startswith("{"):  # the schema itself, inline
        try:
            schema = loads(value)
        except BadJSON as exc:
            raise InvalidRequest(f"--json-schema is not valid JSON: {exc.message}") from None
    else:
        schema = read_json(value, "--json-schema")
    if not isinstance(schema, dict):
        raise InvalidRequest("--json-schema must be a JSON object")
    return schema
