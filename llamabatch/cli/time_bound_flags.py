"""The help of the two time-bound flags `run` and `serve-stdin` share, --watchdog and
--drain-timeout; their values are read by settings/time_bounds.py."""
from __future__ import annotations

from ..settings.time_bounds import DEFAULT_DRAIN_TIMEOUT_S
from ..supervised.watchdog import DEFAULT_FLOOR_S, DEFAULT_MARGIN

WATCHDOG_HELP = (f"Seconds with work in flight and no progress after which the engine process counts as hung, is "
                 f"killed and restarted like a crash (the bound is the larger of this and {DEFAULT_MARGIN:g} x the "
                 f"longest recent step); 0 = off \\[default: {DEFAULT_FLOOR_S:g}]")
DRAIN_HELP = ("After SIGTERM or Ctrl-C: seconds the lines in flight may take to finish before the engine is "
              "stopped and run exits (those lines get no record; --resume runs them) "
              f"\\[default: {DEFAULT_DRAIN_TIMEOUT_S:g}]")
SERVE_DRAIN_HELP = ("After SIGTERM or Ctrl-C (which cancel what is in flight): seconds the engine process gets to "
                    "stop on its own before it is killed; the requests still running then end cancelled "
                    f"\\[default: {DEFAULT_DRAIN_TIMEOUT_S:g}]")
