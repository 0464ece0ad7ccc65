"""The two time bounds `run` and `serve-stdin` share, read from their flags
and config keys (the flags' help: cli/time_bound_flags.py).

- watchdog: the supervised engine's watchdog floor (llamabatch/supervised/watchdog.py): a
  child with work in flight and no progress for max(this, 10 x the longest recent tick) is
  killed and counts as a crash. 0 turns it off; None (set nowhere) is the engine's own default,
  which engines.open_engine applies (the default is the supervised layer's, above this one).
- drain_timeout: after SIGTERM or Ctrl-C, how long in-flight work may take to finish
  before the engine is stopped (run: the lines left get no record, --resume runs them;
  serve-stdin: they end "cancelled"); the command then exits 143 (130 for Ctrl-C).

Flag > the command's config-file table > the default.
"""
from __future__ import annotations

from dataclasses import dataclass

from .file_layer import command_setting

DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TimeBounds:
    watchdog_s: float | None  # None: the supervised engine's default floor
    drain_timeout_s: float


def time_bounds(command: str, watchdog: float | None, drain_timeout: float | None,
                config_path: str | None = None) -> TimeBounds:
    """The flags' values, else the command's config table's (the file --config, `config_path`,
    names, or the default one), else the defaults."""
    if watchdog is None:
        watchdog = command_setting(command, "watchdog", None, config_path)
    if drain_timeout is None:
        drain_timeout = command_setting(command, "drain_timeout", DEFAULT_DRAIN_TIMEOUT_S, config_path)
    return TimeBounds(None if watchdog is None else float(watchdog), float(drain_timeout))
