"""The two time bounds `run` and `serve-stdin` share, as flags and config keys.

- watchdog: the supervised engine's watchdog floor (llamabatch/supervised/watchdog.py): a
  child with work in flight and no progress for max(this, 10 x the longest recent tick) is
  killed and counts as a crash. 0 turns it off.
- drain_timeout: after SIGTERM or Ctrl-C, how long in-flight work may take to finish
  before the engine is stopped (run: the lines left get no record, --resume runs them;
  serve-stdin: they end "cancelled"); the command then exits 143 (130 for Ctrl-C).

Flag > the command's config-file table > the default.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..supervised.watchdog import DEFAULT_FLOOR_S, DEFAULT_MARGIN
from ..settings.file_layer import command_setting

DEFAULT_DRAIN_TIMEOUT_S = 30.0

WATCHDOG_HELP = (f"Seconds with work in flight and no progress after which the engine process counts as hung, is "
                 f"killed and restarted like a crash (the bound is the larger of this and {DEFAULT_MARGIN:g} x the "
                 f"longest recent step); 0 = off \\[default: {DEFAULT_FLOOR_S:g}]")
DRAIN_HELP = ("After SIGTERM or Ctrl-C: seconds the lines in flight may take to finish before the engine is "
              "stopped and run exits (those lines get no record; --resume runs them) "
              f"\\[default: {DEFAULT_DRAIN_TIMEOUT_S:g}]")
SERVE_DRAIN_HELP = ("After SIGTERM or Ctrl-C (which cancel what is in flight): seconds the engine process gets to "
                    "stop on its own before it is killed; the requests still running then end cancelled "
                    f"\\[default: {DEFAULT_DRAIN_TIMEOUT_S:g}]")


@dataclass(frozen=True)
class TimeBounds:
    watchdog_s: float
    drain_timeout_s: float


def time_bounds(command: str, watchdog: float | None, drain_timeout: float | None,
                config_path: str | None = None) -> TimeBounds:
    """The flags' values, else the command's config table's (the file --config, `config_path`,
    names, or the default one), else the defaults."""
    if watchdog is None:
        watchdog = command_setting(command, "watchdog", DEFAULT_FLOOR_S, config_path)
    if drain_timeout is None:
        drain_timeout = command_setting(command, "drain_timeout", DEFAULT_DRAIN_TIMEOUT_S, config_path)
    return TimeBounds(float(watchdog), float(drain_timeout))
