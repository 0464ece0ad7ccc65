"""Starting `run --ray`: connecting to (or starting) Ray, placing the engines on its nodes,
starting one EngineWorker actor per placement and waiting for each to load the model.

Everything that can fail here fails before any line runs, as a RayStartError: no cluster, no
room for the engines, a node without the model.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, NamedTuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..config import EngineConfig
from ..in_process.runners import RunnerChoice
from ..params import SamplingParams
from ..settings.slots import most_slots
from ..version import __version__
from .describe import slots_note
from .dispatch import WorkerState
from .plan import Node, PlacementError, WorkerTally, place_workers
from .ray_errors import RayStartError, first_line
from .worker import RemoteWorker

log = logging.getLogger("llamabatch.ray")

REACH_TIMEOUT_S = 5.0  # a cluster's GCS port that does not accept a connection by then is unreachable
MAX_RESTARTS = 4  # per worker and run: a worker that keeps dying (bad node, poison lines) is given up


class Started(NamedTuple):
    """The workers, each with its model loaded, and what the pool is built from."""

    workers: list[WorkerState]
    model_name: str
    slot_ctx: int  # the smallest of the workers', for stats (with auto and a total n_ctx, workers differ)
    config: EngineConfig  # as given, the model's path made absolute


def open_ray(address: str | None, log_to_driver: bool) -> bool:
    """Start a local Ray instance (`address` None) or join the cluster at `address`, unless the
    caller has already opened a session. Returns whether it had (then it is used as it is, and
    left open)."""
    owns = address is None
    joined = ray.is_initialized()
    if not log_to_driver:  # Ray's own warnings (token auth, ...) are not ours to show; --debug shows them
        logging.getLogger("ray").setLevel(logging.ERROR)
    if not joined and not owns:
        _check_reachable(address)
    # ray.init makes SIGTERM exit at once (status 15); the command's own handler drains and exits 143
    main = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if not joined and owns:
            # "local": a Ray of our own, never a cluster RAY_ADDRESS or an earlier `ray start` points at
            ray.init(address="local", include_dashboard=False, log_to_driver=log_to_driver, configure_logging=False)
        elif not joined:
            ray.init(address=address, log_to_driver=log_to_driver, configure_logging=False)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError ... by case
        hint = ""
        if not owns and not os.environ.get("RAY_AUTH_MODE"):
            hint = (" (a cluster with token authentication also needs RAY_AUTH_MODE=token here and "
                    "its token in ~/.ray/auth_token)")
        raise RayStartError(f"cannot {'start Ray' if owns else f'join the Ray cluster at {address}'}: "
                            f"{first_line(exc)}{hint}") from None
    if on_sigterm is not None:
        signal.signal(signal.SIGTERM, on_sigterm)
    _raylet_messages_to_log()
    return joined


def _check_reachable(address: str) -> None:
    """A HOST:PORT nothing answers at is said at once: Ray itself retries for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or address.startswith("ray://"):
        return  # auto, or a Ray client address: Ray's own error says it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise RayStartError(f"cannot join the Ray cluster at {address}: nothing answers there "
                            f"({exc.strerror or exc})") from None


def start_workers(config: EngineConfig, default_params: SamplingParams, owns: bool, address: str,
                  workers: int | None, cpus: int | None, gpus: float, inflight: int | None,
                  note: Callable[[str], None], max_slots: int | None = None,
                  runner: RunnerChoice | None = None, extra_slots: int = 0) -> Started:
    """Place the engines, start an actor for each, and wait until every one has loaded the model.
    `extra_slots`: slots on each engine reserved for online requests (serve's --online-slots)."""
    nodes = [Node(n["NodeID"], n["NodeManagerAddress"], int(n["Resources"].get("CPU", 0)),
                  float(n["Resources"].get("GPU", 0))) for n in ray.nodes() if n.get("Alive")]
    try:
        placements = place_workers(nodes, workers, cpus, gpus)
    except PlacementError as exc:
        raise RayStartError(str(exc)) from None
    # With "auto" each worker chooses its slot count when it starts; until then plan for the
    # most it may choose (the actor's thread count is fixed when it is created).
    most = most_slots(config) + extra_slots
    cap = inflight or 2 * most
    if config.model is not None:  # the same absolute path on every node, not the driver's cwd
        config = config.replace(model=os.path.abspath(os.path.expanduser(config.model)))
    pool_config = config
    config = config.replace(max_queue=0)  # the pool bounds the queue, for all workers at once
    states = []
    for i, p in enumerate(placements, start=1):
        actor = RemoteWorker.options(
            num_cpus=p.cpus, num_gpus=p.gpus, max_restarts=MAX_RESTARTS, max_task_retries=0,
            max_concurrency=cap + 4,  # room for cancel calls beside `cap` generate calls
            scheduling_strategy=NodeAffinitySchedulingStrategy(p.node.node_id, soft=False),
        ).remote(config.replace(threads=p.cpus), default_params, max_slots, runner, extra_slots)
        w = WorkerState(WorkerTally(f"w{i}", p.node.address, 0, p.cpus), cap, most, node_id=p.node.node_id,
                        actor=actor, start_ref=actor.start.remote(__version__))
        states.append(w)
    note(f"llamabatch run: Ray {'local instance' if owns else address}: {len(nodes)} node(s); starting "
         f"{len(placements)} engine(s) and loading the model on each")
    infos = wait_all([w.start_ref for w in states], note)
    problems = []
    for w, p, info in zip(states, placements, infos):
        w.start_ref = None
        if isinstance(info, BaseException):
            problems.append(f"node {p.node.address}: worker {w.tally.name} did not start: {first_line(info)}")
        elif "error" in info:
            problems.append(f"node {info['node']} ({info['host']}): {info['error']}")
        else:
            w.n_parallel, w.tally.pid, w.reserved = info["n_parallel"], info["pid"], info.get("reserved_slots", 0)
            w.slot_ctx, w.slots_reason = info["slot_ctx"], info.get("slots_reason", "")
            # its engine's own batch slots now that it has chosen, and as many queued; online
            # requests take its reserved slots beyond that (the dispatcher lets them past the cap)
            w.cap = inflight or 2 * w.batch_slots
    if problems:
        more = f" (and {len(problems) - 1} more worker(s))" if len(problems) > 1 else ""
        raise RayStartError(problems[0] + more)
    for w, p in zip(states, placements):
        w.tally.started = time.monotonic()
        note(f"llamabatch run: {w.tally.name}: node {p.node.address}, pid {w.tally.pid}, {p.cpus} CPU(s) = "
             f"threads" + (f", {p.gpus:g} GPU(s)" if p.gpus else "") + f", {slots_note(w)}")
    return Started(states, infos[0]["model_name"], min(w.slot_ctx for w in states), pool_config)


def _raylet_messages_to_log() -> None:
    """Ray prints the raylet's error messages ("A worker died or was killed ...", a paragraph
    each) to the driver's stdout, where run's data may go. Our own one-line notes and the
    summary say what happened; send Ray's text to the log instead (shown with --debug)."""
    import ray._private.worker as ray_worker  # private: if it moves, Ray's own printing stays

    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_llamabatch", False):
        return

    def print_to_log(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines", []):
                log.info("raylet: %s", line)
        else:
            original(data, ignore_prefix)

    print_to_log._llamabatch = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_log


def wait_all(refs: list, note: Callable[[str], None]) -> list:
    """Every start() answer (or its exception), in order; a note every 15 s while models load."""
    results: dict[int, Any] = {}
    waiting = dict(enumerate(refs))
    last_note = time.monotonic()
    while waiting:
        ready, _ = ray.wait(list(waiting.values()), num_returns=len(waiting), timeout=1.0)
        for i, ref in list(waiting.items()):
            if ref in ready:
                try:
                    results[i] = ray.get(ref)
                except Exception as exc:
                    results[i] = exc
                del waiting[i]
        if waiting and time.monotonic() - last_note > 15:
            last_note = time.monotonic()
            note(f"llamabatch run: waiting for {len(waiting)} engine(s) to start (placing and loading the model)")
    return [results[i] for i in range(len(refs))]

