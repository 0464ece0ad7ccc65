"""open_engine and open_pool: the calls every command, job and library user makes for an engine.

Both take a spec: the Resolved settings a command resolved (settings.file_layer), or an
EngineConfig (with default SamplingParams) as a library user writes it. open_engine makes it
ready, once (settings/ready.py: the model chosen and checked, the slots decided and fitted),
and the factory (one per CLI Environment, or a test's) builds the engine from that
value without resolving anything again. Around it, what every caller wants: a prefix store
folder that can never work is said once and dropped before the engine opens, and notices (a
chat-template fallback) reach `on_notice`.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable

from ..config import EngineConfig
from ..errors import InvalidRequest
from ..kernel_paths import resources
from ..params import SamplingParams
from ..prefix_store.folder_check import unusable_because
from ..settings.ready import ready, settings_for
from ..settings.resolved import Resolved
from .factory import EngineFactory

if TYPE_CHECKING:
    from ..api import EngineAPI

log = logging.getLogger("llamabatch.engines")

RAY_INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'llamabatch[ray]'"


def _resolved(spec: Resolved | EngineConfig | None, params: SamplingParams | None) -> Resolved:
    return spec if isinstance(spec, Resolved) else settings_for(spec, params)


def _without_unusable_store(resolved: Resolved, say: Callable[[str], None]) -> Resolved:
    """The store would fail every save in silence: say so, and run without it."""
    store = resolved.engine.prefix_store
    why = unusable_because(store) if store and resolved.engine.prefix_store_max_bytes else None
    if not why:
        return resolved
    say(f"warning: prefix store {store} can't be used ({why}): running without it")
    return resolved.replace(engine=resolved.engine.replace(prefix_store=None))


def open_engine(spec: Resolved | EngineConfig | None = None, params: SamplingParams | None = None, *,
                factory: EngineFactory | None = None, max_slots: int | None = None, isolated: bool = False,
                watchdog_s: float | None = None, on_notice: Callable[[str], None] | None = None,
                extra_slots: int = 0) -> "EngineAPI":
    """An open engine (close it, or use it as a context manager): an Engine in this process, or
    with `isolated` a SupervisedEngine (llama.cpp in a child process; a crash costs a restart).

    The model is checked and n_parallel "auto" decided here, once, bounded by `max_slots`
    (e.g. the number of lines a job has). `watchdog_s`: the supervised engine's watchdog
    floor (None: its default; 0: off). `on_notice`: one line for people at a time (default:
    a logged warning). `extra_slots`: slots added once n_parallel is decided (serve's slots
    for online requests, on top of the batch's). Raises ModelLoadError (one line) for a model
    that cannot load, InvalidRequest for settings that cannot work."""
    say = on_notice or (lambda line: log.warning("%s", line))
    factory = factory or EngineFactory()
    settings = _without_unusable_store(ready(spec, params, max_slots, factory.choose_slots, extra_slots=extra_slots),
                                       say)
    engine = factory.open(settings, isolated=isolated, watchdog_s=watchdog_s)
    notice = resources.threads_beyond_cpus(settings.engine)  # once open: a count refused outright gets its error alone
    if notice:
        say(notice)
    if on_notice is not None:
        engine.on_notice = on_notice
    return engine


def open_pool(spec: Resolved | EngineConfig | None = None, params: SamplingParams | None = None, *,
              address: str | None = None, workers: int | None = None, cpus_per_worker: int | None = None,
              gpus_per_worker: float = 0.0, max_slots: int | None = None, watchdog_s: float | None = None,
              log_to_driver: bool = False, note: Callable[[str], None] = lambda _line: None,
              factory: EngineFactory | None = None, extra_slots: int = 0) -> "EngineAPI":
    """Engines on Ray workers behind one submit (cluster/pool.py's RayPool), started and with
    the model loaded on every worker before this returns.

    `address`: a Ray cluster to join (None: a Ray instance of this process's own on this
    machine); `workers`, `cpus_per_worker`, `gpus_per_worker`: the placement (None: as many
    as fit). Each worker decides n_parallel "auto" on its own node, bounded by `max_slots`, and
    reserves `extra_slots` more for requests above the default priority (serve's --online-slots).
    `note`: progress lines for people while the workers start. Raises InvalidRequest when Ray
    is not installed, ClusterStartError when the engines cannot start (no cluster, no room,
    a node without the model)."""
    if address is None:
        # A Ray instance of our own serves this machine only: Ray then gives its node the
        # loopback address instead of the machine's network one (read when ray is imported).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray  # noqa: F401  (the check only: cluster/pool.py is the module that uses it)
    except ImportError:
        raise InvalidRequest(RAY_INSTALL_HINT) from None
    resolved = _resolved(spec, params)
    return (factory or EngineFactory()).ray_pool(
        resolved, address=address, workers=workers, cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker, max_slots=max_slots, watchdog_s=watchdog_s,
        log_to_driver=log_to_driver, note=note, extra_slots=extra_slots)
