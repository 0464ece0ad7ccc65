"""A job's own settings (`JobSpec`: `llamabatch run`'s options, as keyword arguments of
run_job), what it runs among (`JobHost`), and resolving both once, before anything opens.

Keyword arguments are the names of run's options (`order`, `resume`, `error_file`, ...) and
of the shared engine and sampling options (`model`, `n_parallel`, `temperature`, ...). They
take the place of flags: LLAMABATCH_* variables and the config file fill in what they leave
unset, exactly as for `llamabatch run` (docs/config.md). A bad value raises InvalidRequest.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from ..checks import value_rules as checks
from ..errors import InvalidRequest
from ..settings.file_layer import command_settings, resolve_command
from ..settings.layers import ENGINE_KEYS, SAMPLING_KEYS, SHARED_KEYS, merge
from ..settings.resolved import Resolved
from ..settings.time_bounds import DEFAULT_DRAIN_TIMEOUT_S, TimeBounds
from .tables.table_input import TableOptions

COMMAND = "run"  # the config file's table these settings read, and the default model's command
CONFIG_KEYS = ("order", "max_inflight", "reorder_window", "error_file", "watchdog", "drain_timeout")  # in [run]
TABLE_KEYS = tuple(f.name for f in dataclasses.fields(TableOptions))
log = logging.getLogger("llamabatch.jobs")


@dataclass(frozen=True)
class JobSpec:
    """What to run and how, apart from the engine and sampling settings (the Resolved)."""

    input: str  # a prompts file, a table, or "-" for the host's stdin
    output: str | None = None  # None or "-": the host's stdout
    input_format: str = "auto"  # auto, text, jsonl
    system: str | None = None  # system prompt for lines without one
    order: str | None = None  # input or completion; None: [run] order in the config file, else input
    max_inflight: int | None = None  # lines in the engine at once [default: 4 x n_parallel]
    reorder_window: int | None = None  # lines read ahead to choose the next to start [default: 4 x n_parallel]
    resume: bool = False
    echo: bool = False
    embed: bool = False
    fail_on_error: bool = False  # the CLI's exit status only; the job runs the same
    isolate: bool = True  # llama.cpp in a supervised child process
    watchdog: float | None = None
    drain_timeout: float | None = None
    ray: str | None = None  # "local", "auto", HOST:PORT or ray://HOST:PORT
    ray_workers: int | None = None
    ray_cpus_per_worker: int | None = None
    ray_gpus_per_worker: float | None = None
    verify: int | None = None
    error_file: str | None = None
    retry_failed: bool = False
    allow_changed_settings: bool = False
    tables: TableOptions = TableOptions()  # docs/tables.md
    logprobs: int | None = None

    @property
    def input_path(self) -> str:  # the name table_plan and the estimate read
        return self.input

    @property
    def bounds(self) -> TimeBounds:
        """The watchdog floor and the drain bound (settings/time_bounds.py), as set or read from [run]."""
        drain = self.drain_timeout if self.drain_timeout is not None else DEFAULT_DRAIN_TIMEOUT_S
        return TimeBounds(None if self.watchdog is None else float(self.watchdog), float(drain))


OWN_KEYS = tuple(f.name for f in dataclasses.fields(JobSpec) if f.name not in ("input", "output", "tables"))

_flag = checks.boolean
_count = checks.optional(checks.integer(1, "an integer >= 1"))
CHECKS: dict[str, checks.Rule] = {
    "input_format": checks.choice("auto", "text", "jsonl"),
    "system": checks.optional(checks.text()),
    "order": checks.optional(checks.choice("input", "completion")),
    "max_inflight": _count,
    "reorder_window": checks.optional(checks.integer(0, "an integer >= 0")),
    "watchdog": checks.optional(checks.seconds()), "drain_timeout": checks.optional(checks.seconds()),
    "ray": checks.optional(checks.text("an address: local, auto, HOST:PORT or ray://HOST:PORT")),
    "ray_workers": _count, "ray_cpus_per_worker": _count,
    "ray_gpus_per_worker": checks.optional(checks.seconds("a number >= 0")),
    "verify": _count, "error_file": checks.optional(checks.text("a path")),
    "logprobs": checks.optional(checks.integer(0, "an integer in [0, 20]")),
    **{key: _flag for key in ("resume", "echo", "embed", "fail_on_error", "isolate", "retry_failed",
                              "allow_changed_settings")},
}


@dataclass
class JobHost:
    """What a job runs among. The defaults suit a Python caller; the CLI hands its own streams,
    its engine factory and its command line."""

    stdin: TextIO | None = None  # INPUT "-" reads it (None: the process's)
    stdout: TextIO | None = None  # OUTPUT None or "-" writes it (None: the process's)
    config_path: str | None = None  # the config file (None: $LLAMABATCH_CONFIG, ./llamabatch.toml, ...)
    argv: tuple[str, ...] = ("run_job",)  # the manifest's record of what started the job
    engine_factory: Any = None  # how the job's own engine is built (llamabatch.engines.EngineFactory; None: the real one)
    # lines for people outside the events: the default model's, the job's own engine's notices
    # (a chat-template fallback, an unusable prefix store); None: they are Notice events, or logged
    tell: Callable[[str], None] | None = None
    debug: bool = False  # Ray workers' logs reach this process; a start failure keeps its traceback


def job_settings(input: str, output: str | None, settings: dict[str, Any], host: JobHost,
                 engine: Any = None) -> tuple[JobSpec, Resolved]:
    """The job's own settings and the engine's, resolved once, here: the engine's from the
    layers (given > LLAMABATCH_* env > config file > defaults; run's chat-tuned model where none is
    named and it is installed) or, on a shared `engine`, its own with the sampling given on top. Raises
    InvalidRequest (bad settings) or ModelLoadError (a model name that matches nothing).

    The config file is read once: [run]'s own keys fill what no setting gave (a setting wins;
    docs/config.md) as the engine's settings are resolved from the same layers."""
    spec, shared = split_settings(input, output, settings)
    missing = tuple(key for key in CONFIG_KEYS if getattr(spec, key) is None)
    if engine is None:
        resolved, found = resolve_command(shared, COMMAND, missing, host.config_path, host.tell or log.warning)
        return _with_config_keys(spec, found), resolved
    if spec.ray is not None:
        raise InvalidRequest("ray starts engines of its own: drop it, or the shared engine")
    found = command_settings(COMMAND, missing, host.config_path)
    return _with_config_keys(spec, found), settings_of_engine(engine, shared)


def split_settings(input: str, output: str | None, settings: dict[str, Any]) -> tuple[JobSpec, dict[str, Any]]:
    """(the job's own settings, the shared engine/sampling ones). Raises InvalidRequest."""
    unknown = sorted(set(settings) - set(OWN_KEYS) - set(TABLE_KEYS) - set(SHARED_KEYS))
    if unknown:
        raise InvalidRequest(f"unknown setting {unknown[0]!r}: run_job takes llamabatch run's options "
                             "(docs/library.md)")
    own = {key: settings[key] for key in OWN_KEYS if key in settings}
    for key, value in own.items():
        try:
            own[key] = CHECKS[key](value)
        except ValueError as exc:
            raise InvalidRequest(f"{key} must be {exc}, got {value!r}") from None
    if own.get("logprobs") is not None and own["logprobs"] > 20:
        raise InvalidRequest(f"logprobs must be an integer in [0, 20], got {own['logprobs']!r}")
    tables = TableOptions(**{key: settings[key] for key in TABLE_KEYS if settings.get(key) is not None})
    spec = JobSpec(input=input, output=output, tables=tables, **own)
    return spec, {key: settings.get(key) for key in SHARED_KEYS}


def _with_config_keys(spec: JobSpec, found: dict[str, Any]) -> JobSpec:
    """`spec` with run's own keys the [run] table sets (`found`) where no setting gave them,
    before anything reads them; order defaults to input."""
    spec = dataclasses.replace(spec, **{key: value for key, value in found.items() if value is not None})
    return spec if spec.order is not None else dataclasses.replace(spec, order="input")


def settings_of_engine(engine: Any, shared: dict[str, Any]) -> Resolved:
    """The settings a job on a shared engine runs with: the engine's own, its default sampling
    with the sampling settings given on top. Engine settings cannot change an open engine."""
    named = [key for key in ENGINE_KEYS if shared.get(key) is not None]
    if named:
        raise InvalidRequest(f"{named[0]} is a setting of the engine, which is open already: drop it, or let "
                             "the job open its own engine")
    given = {key: shared[key] for key in SAMPLING_KEYS if shared.get(key) is not None}
    parsed = merge(given, COMMAND, environ={}).sampling  # grammar files read, schemas parsed
    fields = {"grammar" if key == "grammar_file" else key for key in given}
    sampling = engine.default_params.replace(**{name: getattr(parsed, name) for name in fields})
    return Resolved(engine.config, sampling, {key: "given" for key in given})
