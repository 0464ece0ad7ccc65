"""`llamabatch serve`: OpenAI's Files and Batches API and online completions over HTTP. The
service is the library's (llamabatch/serve/http/); this module is its command line: flags,
the engine, one line saying where it listens, and the exit."""
from __future__ import annotations

import os
from typing import Annotated, Any, Optional

import typer

from ...errors import InvalidRequest
from ..engine_setup import open_engine, resolve_options
from ..env import Environment
from ..engine_options import EngineOptions, with_engine_options
from ..exit_status import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated
from .on_ray import CPUS_HELP, GPUS_HELP, RAY_HELP, WORKERS_HELP, open_ray_engines

API_KEY_ENV = "LLAMABATCH_API_KEY"
SERVE_EXTRA = "llamabatch serve needs the serve extra (Starlette, uvicorn, python-multipart, prometheus_client): pip install 'llamabatch[serve]'"


@with_engine_options
def serve_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on; anything but a loopback address "
                                                     "needs --api-key")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: a free one, printed)")] = 8080,
    data_dir: Annotated[Optional[str], typer.Option(
        "--data-dir", metavar="DIR", show_default=False,
        help="Where files, batches and their catalogue are kept \\[default: $XDG_DATA_HOME/llamabatch/serve, "
             "else ~/.local/share/llamabatch/serve]")] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", metavar="KEY", show_default=False,
        help=f"Requests must send 'Authorization: Bearer KEY' (also ${API_KEY_ENV}) \\[default: none, "
             "loopback only]")] = None,
    health_without_key: Annotated[bool, typer.Option(
        "--health-without-key",
        help="GET /health answers without the API key (a probe that cannot send one), as llama-server's")] = False,
    cors_origin: Annotated[Optional[list[str]], typer.Option(
        "--cors-origin", metavar="ORIGIN", show_default=False,
        help="Let web pages from ORIGIN (https://app.example.com; * for any) call the API from a browser; "
             "repeat for more \\[default: none]")] = None,
    online_slots: Annotated[int, typer.Option(
        "--online-slots", min=0,
        help="Slots for online requests on top of --n-parallel, which batches keep to themselves (each costs "
             "one slot's KV cache, and on a CPU a decode row more than the batch's). 0: none; online requests "
             "still go first (a higher priority), putting a batch line aside when every slot is busy")] = 0,
    max_concurrent_batches: Annotated[Optional[int], typer.Option(
        "--max-concurrent-batches", metavar="N", min=1, show_default=False,
        help="Batches that run at once, sharing the engine's slots in turn; the rest wait, in the order "
             "they were created (1: one at a time) \\[default: every batch that has not ended]")] = None,
    isolate: Annotated[bool, typer.Option(
        "--isolate/--no-isolate",
        help="Run llama.cpp in a supervised child process: a request that crashes it costs a restart of the "
             "child and gets an engine_crashed error, not the server. --no-isolate: in this process")] = True,
    allow_changed_settings: Annotated[bool, typer.Option(
        "--allow-changed-settings",
        help="A batch resumed at start whose settings differ from those it started with (another --temperature, "
             "model, ...) finishes with the new ones, recorded in its manifest, instead of failing")] = False,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="[ADDRESS]", show_default=False,
                                               rich_help_panel="Ray", help=RAY_HELP)] = None,
    ray_workers: Annotated[Optional[int], typer.Option("--ray-workers", min=1, show_default=False,
                                                       rich_help_panel="Ray", help=WORKERS_HELP)] = None,
    ray_cpus_per_worker: Annotated[Optional[int], typer.Option("--ray-cpus-per-worker", min=1, show_default=False,
                                                               rich_help_panel="Ray", help=CPUS_HELP)] = None,
    ray_gpus_per_worker: Annotated[Optional[float], typer.Option("--ray-gpus-per-worker", min=0.0,
                                                                 show_default=False, rich_help_panel="Ray",
                                                                 help=GPUS_HELP)] = None,
    *,
    opts: EngineOptions,
    env: Environment,
) -> None:
    """Serve OpenAI's Files and Batches API and /v1/chat/completions, /v1/completions and
    /v1/embeddings on one engine: batches run side by side, sharing it, and survive restarts;
    online requests go ahead of batch lines. Until Ctrl-C or SIGTERM."""
    try:
        from ...serve.http.app import build_app
        from ...serve.http.server import bind, check_bind, listen
        from ...serve.http.service import Service
        from ...serve.http.data_dir import default_data_dir
        from ...serve.http.loading import answering_while_loading, loading_app
    except ImportError as exc:
        raise InvalidRequest(f"{SERVE_EXTRA} ({exc.name} is missing)") from None
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
    check_bind(host, key)
    folder = data_dir or default_data_dir()
    resolved = resolve_options(opts, env)
    # the address first: a port taken or a host not of this machine is one line, before the model loads
    sock = bind(host, port)
    try:
        shown = f"[{host}]" if ":" in host else host
        env.say(f"llamabatch serve: loading the model; http://{shown}:{sock.getsockname()[1]}/health answers "
                "503 until it is ready")
        with answering_while_loading(sock, loading_app(key, health_without_key=health_without_key,
                                                       cors_origins=cors_origin or ())):
            if ray is None:
                engine = open_engine(resolved, env, isolated=isolate, extra_slots=online_slots)
            else:
                engine = open_ray_engines(resolved, env, ray, ray_workers, ray_cpus_per_worker, ray_gpus_per_worker,
                                          online_slots)
                online_slots = engine.stats().reserved_slots  # on every worker: the pool's in all
    except BaseException:
        sock.close()
        raise
    try:
        service = Service(engine, folder, online_slots=online_slots, max_concurrent_batches=max_concurrent_batches,
                          job_settings={"allow_changed_settings": allow_changed_settings})
        try:
            app = build_app(service, key, health_without_key=health_without_key, cors_origins=cors_origin or ())
            listening = listen(app, host, port, sock)
            service.start()
            env.say(f"llamabatch serve: {engine.model_name} on http://{shown}:{listening.port}/v1 "
                    f"({_slots(engine.stats().n_parallel - online_slots, online_slots, resolved.engine.kv_unified, ray)}, "
                    f"data in {service.data.root})")
            stopped_by = _serve_until_stopped(listening)
        finally:
            service.close(timeout=30)
    finally:
        sock.close()  # uvicorn closes it when it served; not when Service or the app failed first
        engine.close()
    if stopped_by is not None:
        raise typer.Exit(stopped_by)


def _slots(batch: int, online: int, shared: bool, ray: str | None = None) -> str:
    """"8 slots + 1 for online requests, one KV cache they share": what a user tunes next."""
    return (f"{batch} slots" + (f" + {online} for online requests" if online else "")
            + (" over the Ray workers" if ray else ", one KV cache they share" if shared else ", a KV stream each"))


def _serve_until_stopped(listening: Any) -> int | None:
    """Serve; the exit code of the signal that stopped it (None: stopped otherwise). uvicorn shuts
    down on Ctrl-C or SIGTERM and then raises the signal again (KeyboardInterrupt, or app.main's
    Terminated): the way `serve` is meant to end, so it exits 130 or 143 and says nothing more.
    Where the raise does nothing (SIGINT inherited as ignored), the signal uvicorn caught says it."""
    try:
        listening.run()
    except Terminated:
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    sig = listening.stop_signal
    return None if sig is None else 128 + int(sig)
