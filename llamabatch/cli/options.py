"""The options every command shares, declared once and resolved in one place.

Each shared option defaults to None ("not given on the command line") so settings can be
layered: flags > LLAMABATCH_* environment > config file > built-in defaults. `resolve`
returns the EngineConfig, the default SamplingParams and where each value came from.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import typing
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Callable, Optional

import typer

from ..config import EngineConfig
from .config.config_file import ENGINE_RULES
from ..core.policies import POLICIES
from ..errors import InvalidRequest
from ..params import SamplingParams

ENGINE = "Engine"
SAMPLING = "Sampling"


def _opt(*decls: str, help: str, panel: str, **kw: Any) -> Any:
    # "[default: x]" would be read as rich markup and vanish: escape the bracket
    return typer.Option(*decls, help=help.replace("[", "\\["), rich_help_panel=panel, show_default=False, **kw)


# name -> (annotation, where the value goes). Keys are the config-file / env spelling.
SHARED_OPTIONS: dict[str, Any] = {
    "model": Annotated[Optional[str], _opt("--model", "-m", help="GGUF file or folder[:QUANT], hf:ORG/REPO[:QUANT], ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO[:QUANT] or a [models] alias (`llamabatch models` lists them) [default: bundled Gemma 3 270M]", panel=ENGINE)],
    "n_parallel": Annotated[Optional[str], _opt("--n-parallel", metavar="N|auto", help="Slots: sequences decoded together; auto = measure the fastest count on this machine (cached) [default: auto; chat: 1]", panel=ENGINE)],
    "n_ctx": Annotated[Optional[int], _opt("--n-ctx", help="Total context, split evenly between slots [default: 4096 per slot]", panel=ENGINE)],
    "n_batch": Annotated[Optional[int], _opt("--n-batch", help="Most tokens in one forward pass [default: 512]", panel=ENGINE)],
    "chunk_size": Annotated[Optional[int], _opt("--chunk-size", help="Most prompt tokens per slot per tick [default: 256]", panel=ENGINE)],
    "threads": Annotated[Optional[int], _opt("--threads", "-t", help="CPU threads [default: all cores, at most 8]", panel=ENGINE)],
    "policy": Annotated[Optional[str], _opt("--policy", help=f"Batch policy: {', '.join(POLICIES)} [default: decode-maximal]", panel=ENGINE)],
    "cache_prompt": Annotated[Optional[bool], _opt("--cache-prompt/--no-cache-prompt", help="Reuse cached prompt prefixes [default: on]", panel=ENGINE)],
    "n_gpu_layers": Annotated[Optional[int], _opt("--n-gpu-layers", help="Layers offloaded to the GPU, -1 = all [default: 0]", panel=ENGINE)],
    "chat_template": Annotated[Optional[str], _opt("--chat-template", help="Chat format NAME (llama.cpp's built-ins: chatml, llama2, mistral-v7, phi3, ...; or plain) or a Jinja FILE [default: the GGUF's own]", panel=ENGINE)],
    "deterministic": Annotated[Optional[bool], _opt("--deterministic/--no-deterministic", help="A request's tokens depend only on its prompt, sampling settings and seed, not on what else runs (CPU builds) [default: off]", panel=ENGINE)],
    "cpu_buffers": Annotated[Optional[str], _opt("--cpu-buffers", metavar="auto|plain|repack", help="CPU weight layout, and so which llama.cpp kernels run: auto = llama.cpp's default (AMX only where a probe shows it runs), plain = as in the file, repack = CPU_REPACK only [default: auto]", panel=ENGINE)],
    "max_memory": Annotated[Optional[str], _opt("--max-memory", metavar="SIZE|N%|off", help="Most memory the KV cache and weights may take, checked before the model loads: a size (16GiB, 512M), a share of the memory available (80%) or off [default: 90%]", panel=ENGINE)],
    "max_tokens": Annotated[Optional[int], _opt("--max-tokens", help="Most tokens generated per request [default: 256]", panel=SAMPLING)],
    "temperature": Annotated[Optional[float], _opt("--temperature", help="0 = greedy [default: 0.8]", panel=SAMPLING)],
    "top_k": Annotated[Optional[int], _opt("--top-k", help="[default: 40]", panel=SAMPLING)],
    "top_p": Annotated[Optional[float], _opt("--top-p", help="[default: 0.95]", panel=SAMPLING)],
    "min_p": Annotated[Optional[float], _opt("--min-p", help="[default: 0.05]", panel=SAMPLING)],
    "repeat_penalty": Annotated[Optional[float], _opt("--repeat-penalty", help="[default: 1.0, off]", panel=SAMPLING)],
    "seed": Annotated[Optional[int], _opt("--seed", help="Sampling seed [default: random per request]", panel=SAMPLING)],
    "stop": Annotated[Optional[list[str]], _opt("--stop", help="Stop string (repeatable)", panel=SAMPLING)],
    "grammar_file": Annotated[Optional[str], _opt("--grammar-file", help="GBNF grammar file constraining output", panel=SAMPLING)],
    "json_schema": Annotated[Optional[str], _opt("--json-schema", help="JSON schema (inline JSON or a file) constraining output", panel=SAMPLING)],
}

ENGINE_KEYS = tuple(ENGINE_RULES)  # EngineConfig's keys a flag, env variable or config file sets
SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "stop",
                 "grammar_file", "json_schema")


@dataclass
class SharedOptions:
    """The shared options as given on the command line (None = not given)."""

    values: dict[str, Any] = field(default_factory=dict)
    command: str = ""

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)


def with_shared_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add every shared option to a Typer command; the command receives them as `opts`."""
    sig = inspect.signature(func)
    # With `from __future__ import annotations` the command's own annotations are strings, and
    # Typer does not evaluate strings found in an explicit __signature__: evaluate them here, or
    # its Annotated[..., typer.Option(...)] declarations (names, help, min=...) are lost.
    hints = typing.get_type_hints(func, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values() if p.name != "opts"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
             for name, ann in SHARED_OPTIONS.items()]

    # The command's name, which picks its config-file table: run_command -> "run", serve_stdin -> "serve-stdin".
    command = func.__name__.removesuffix("_command").replace("_", "-")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        shared = {name: kwargs.pop(name, None) for name in SHARED_OPTIONS}
        if shared.get("stop") == []:
            shared["stop"] = None  # a list option with nothing given is "not given"
        return func(*args, opts=SharedOptions(shared, command), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.config_command = command  # type: ignore[attr-defined]
    return wrapper


# Built-in defaults that differ for one command, below every other layer. One conversation
# needs one slot, which then gets all of --n-ctx.
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {"chat": {"n_parallel": 1}, "run": {"n_parallel": "auto"},
                                               "serve-stdin": {"n_parallel": "auto"}}


@dataclass
class Resolved:
    engine: EngineConfig
    sampling: SamplingParams
    sources: dict[str, str]  # key -> "flag" | "env LLAMABATCH_X" | "file:line" | "default"


def env_name(key: str) -> str:
    return "LLAMABATCH_" + key.upper()


def _from_env(key: str, kind: Any) -> Any:
    raw = os.environ.get(env_name(key))
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
    if key == "max_memory":  # "16GiB", "80%", "off" or bytes: the setting's rule reads the text
        return str
    if key in ("cache_prompt", "deterministic"):
        return bool
    defaults = {f.name: f.type for f in fields(EngineConfig)} | {f.name: f.type for f in fields(SamplingParams)}
    t = str(defaults.get(key, "str"))
    return int if t.startswith("int") else float if t.startswith("float") else str


def resolve(opts: SharedOptions, file_values: dict[str, tuple[Any, str]] | None = None) -> Resolved:
    """Merge the layers for every shared key: flag > env > config file > default."""
    file_values = file_values or {}
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in SHARED_OPTIONS:
        flag = opts[key]
        if key == "n_parallel" and flag is not None:
            flag = parse_slots(flag)
        if flag is not None:
            chosen[key], sources[key] = flag, "flag"
            continue
        env = _from_env(key, _kind(key))
        if env is not None:
            chosen[key], sources[key] = env, f"env {env_name(key)}"
        elif key in file_values:
            chosen[key], sources[key] = file_values[key]
        elif key in COMMAND_DEFAULTS.get(opts.command, {}):
            chosen[key], sources[key] = COMMAND_DEFAULTS[opts.command][key], f"default ({opts.command})"
        else:
            sources[key] = "default"
    engine = EngineConfig.from_dict({k: chosen[k] for k in ENGINE_KEYS if k in chosen})
    sampling_values = {k: chosen[k] for k in SAMPLING_KEYS if k in chosen and k not in ("grammar_file", "json_schema")}
    # Sampling fields without a flag (presence_penalty, timeout, ...) can come from the config file only.
    extra = {k: v for k, v in file_values.items() if k not in SHARED_OPTIONS}
    sources.update({k: where for k, (_, where) in extra.items()})
    sampling_values = {k: v for k, (v, _) in extra.items()} | sampling_values
    if "grammar_file" in chosen:
        sampling_values["grammar"] = _read_text(chosen["grammar_file"], "--grammar-file")
    if "json_schema" in chosen:
        sampling_values["json_schema"] = _json_schema(chosen["json_schema"])
    sampling = SamplingParams.from_dict(sampling_values)
    return Resolved(engine, sampling, sources)


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise InvalidRequest(f"{what} {path}: {exc.strerror or exc}") from None


def _json_schema(value: str) -> dict:
    text = value if value.lstrip().startswith("{") else _read_text(value, "--json-schema")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--json-schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise InvalidRequest("--json-schema must be a JSON object")
    return schema
