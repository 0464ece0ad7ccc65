"""The two calls every engine-running command makes: resolve its engine and sampling options
(the settings layer, once), and open its engine (llamabatch.engines, with the Environment's factory)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..settings.file_layer import resolve_command_settings
from ..settings.resolved import Resolved
from .engine_options import EngineOptions
from .env import Environment

if TYPE_CHECKING:
    from ..api import EngineAPI


def resolve_options(opts: EngineOptions, environment: Environment) -> Resolved:
    """Flags > LLAMABATCH_* env > config file (--config from `environment`) > defaults, the
    model named by them resolved (settings.file_layer.resolve_command_settings), once, before
    any input is read. Bad values raise InvalidRequest (exit 2); an unknown model name is a
    ModelLoadError (one line, exit 1)."""
    return resolve_command_settings(opts.values, opts.command, environment.config_path,
                                    lambda line: environment.say(f"llamabatch: {line}"))


def open_engine(resolved: Resolved, environment: Environment, max_slots: int | None = None, *,
                isolated: bool = False, watchdog_s: float | None = None, extra_slots: int = 0) -> "EngineAPI":
    """The command's engine, from the environment's factory (llamabatch.engines.open_engine:
    the model loaded, n_parallel "auto" decided, bounded by `max_slots`; `isolated`: in a
    supervised child process; `watchdog_s`: its watchdog floor; `extra_slots`: slots on top of
    n_parallel). Its notices (a chat-template fallback, an unusable prefix store) are lines on stderr."""
    from .. import engines  # here, not at the top: a command's --help never loads the engine

    return engines.open_engine(resolved, factory=environment.engine_factory, max_slots=max_slots,
                               isolated=isolated, watchdog_s=watchdog_s, extra_slots=extra_slots,
                               on_notice=lambda line: environment.say(f"llamabatch: {line}"))
