"""The engine API: what every caller (the CLI's commands, benchmarks, library users) may use of
an engine, whichever of the three runs the requests:

- `llamabatch.Engine`: the engine thread in this process (core/engine.py);
- `llamabatch.supervised.SupervisedEngine`: the same engine in a child process that is
  restarted when llama.cpp takes it down (supervised/engine.py);
- `llamabatch.cluster.pool.RayPool`: engines on Ray workers behind one submit (cluster/pool.py).

The behaviour they share is written once, in core/engine_base.py; tests/test_engine_contract.py
runs one contract over all three. Callers type against `EngineAPI` and never probe for
attributes: an engine that cannot restart says `restarts == 0`, one that cannot fail as a
whole says `fatal_error is None`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Protocol, Sequence, runtime_checkable

from .config import EngineConfig
from .params import SamplingParams
from .results import Delta, Embedding, Result

if TYPE_CHECKING:  # annotations only: the protocol describes the engines, it imports none of them
    from .core.handle import EventCallback
    from .core.inputs import Prompt
    from .core.telemetry import EngineStats, Telemetry


@runtime_checkable
class Handle(Protocol):
    """One submitted request (core/handle.py's RequestHandle for every engine)."""

    request_id: int

    @property
    def done(self) -> bool: ...

    def __iter__(self) -> Iterator[Delta]:
        """The streamed Deltas (with stream=True), ending when the Result is there."""

    def result(self, timeout: float | None = None) -> Result:
        """The one terminal Result; TimeoutError when `timeout` seconds pass first."""

    def cancel(self) -> None:
        """Ask the engine to stop the request; its Result then says 'cancelled'."""


@runtime_checkable
class EngineAPI(Protocol):
    """A continuous-batching engine, used as a context manager.

    Every request gets exactly one terminal Result (finish_reason stop, length, cancelled,
    error or timeout), also at close(). `submit` raises QueueFull when `max_queue` requests
    already wait beyond the slots (nothing is counted then), EngineClosed after close()."""

    config: EngineConfig  # as the engine was opened with
    default_params: SamplingParams  # what a request without its own SamplingParams gets
    telemetry: Telemetry  # the running totals behind stats()
    model_name: str  # what records call the model
    slot_ctx: int  # tokens one slot holds
    kernels: str  # which CPU kernels llama.cpp runs, and why ("" where unknown)
    slots_reason: str  # why this many slots, when n_parallel "auto" chose them ("" otherwise)
    fatal_error: str | None  # set when the engine can serve nothing more (no process could be restarted)
    restarts: int  # engine processes started again after a crash (0 in-process)
    hangs: int  # of those, processes the watchdog killed as hung
    isolated: Sequence[int]  # request ids ended with engine_crashed (the request that took the process down)
    recovers_crashes: bool  # whether the engine survives a crash of llama.cpp (restarts/hangs/isolated mean something)
    disk: Any  # the disk prefix store (core/disk_prefix.DiskPrefixes) of an engine in this process; None otherwise

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> None: ...

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, *, stream: bool = True,
               callback: EventCallback | None = None) -> Handle:
        """Queue one request; never blocks on generation. Bad input ends the handle with 'error'."""

    def generate(self, prompts: Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Result]:
        """Run every prompt concurrently (waiting for room when the queue is bounded); results in input order."""

    def save_prefix(self, prompt: Prompt, *, timeout: float | None = None) -> Result:
        """Evaluate `prompt` and save its KV to the disk prefix store; Result.stored_prefix names the entry."""

    def submit_embedding(self, inputs: Any, *, pooling: str | None = None, normalize: bool = True,
                         truncate: bool = False, timeout: float | None = None, dimensions: int | None = None,
                         callback: EventCallback | None = None) -> Handle:
        """Queue one embeddings request (a string, strings, token ids, or lists of them); its
        result() is an EmbeddingResult with the same outcomes as generation's, exactly once.
        The Ray pool serves none: its handle ends at once with error code "unsupported"."""

    def embed(self, inputs: Any, *, pooling: str | None = None, normalize: bool = True,
              truncate: bool = False, dimensions: int | None = None) -> list[Embedding]:
        """One vector per input, in order; raises EmbeddingFailed when the request has none."""

    def hold(self) -> ContextManager[None]:
        """Requests submitted inside the block start together (only submit inside)."""

    def stats(self) -> EngineStats: ...

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Receive RequestRecords (and TickRecords where the engine ticks here); returns unsubscribe."""

    def tokenize(self, text: str, *, special: bool = False, add_special: bool = True) -> list[int]:
        """`special`: special-token text becomes those tokens; `add_special`: with the BOS (and
        EOS) the model adds to a prompt."""

    def token_pieces(self, tokens: Sequence[int]) -> list[bytes]:
        """Each token's text as bytes, special tokens shown (llama-server's /detokenize pieces);
        InvalidRequest for anything that is not a token id of the model."""

    @property
    def ready(self) -> bool:
        """Whether the engine serves requests now: False while a crashed engine process restarts,
        after fatal_error, and after close(). Never blocks (a health probe reads it)."""

    def close(self, timeout: float | None = None) -> None:
        """End every request without an outcome ('cancelled'), then stop. `timeout`: how long an
        engine in another process gets to stop on its own before it is killed (in-process: unused)."""

    def kill(self) -> None:
        """Stop now, without waiting for work in progress: what has no outcome ends 'cancelled'."""


@runtime_checkable
class ChatEngine(EngineAPI, Protocol):
    """An engine that knows its model's chat template (Engine, SupervisedEngine: the chat and
    serve-stdin commands use these; the Ray pool's model lives on its workers only)."""

    on_notice: Callable[[str], None]  # one line for people (a chat-template fallback)

    @property
    def chat_template(self) -> Any: ...

    def render_chat(self, messages: Sequence[dict]) -> str: ...
