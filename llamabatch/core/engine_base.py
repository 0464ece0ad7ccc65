"""What the three engines (Engine, SupervisedEngine, the Ray pool) do the same way, written once:
the bounded submit loop of `generate`, max_queue admission, the terminal-result telemetry and
the Results of requests that end without running (see llamabatch/api.py for the interface).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..errors import InvalidRequest, LlamaBatchError, QueueFull
from ..params import SamplingParams
from ..results import Embedding, EmbeddingResult, Result, Timings, Usage
from .embedding import EmbedRequest
from .handle import EventCallback, RequestHandle
from .inputs import Prompt
from .telemetry import RequestRecord, Telemetry

QUEUE_FULL_WAIT_S = 1.0  # generate(): how long it waits on its oldest pending request before trying again
QUEUE_FULL_NAP_S = 0.01  # ... and when none of its own is pending (someone else's requests fill the queue)


class EngineBase:
    """The part of the engine API every engine has the same way. The defaults say "an engine
    in this process": no restarts, nothing isolated, never failed as a whole."""

    kernels: str = ""
    slots_reason: str = ""
    fatal_error: str | None = None
    restarts: int = 0
    hangs: int = 0
    isolated: Sequence[int] = ()
    recovers_crashes: bool = False
    disk: Any = None  # the disk prefix store this process's engine uses (core/prefixes/disk_prefix.py); None elsewhere

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def generate(self, prompts: Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Result]:
        """Run every prompt concurrently; results come back in input order. With a bounded queue
        (max_queue) a refused submit waits for this call's oldest pending request, then tries again."""
        per = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(per) != len(prompts):
            raise InvalidRequest(f"{len(prompts)} prompts but {len(per)} SamplingParams")
        handles: list[Any] = []
        for prompt, p in zip(prompts, per):
            while True:
                try:
                    handles.append(self.submit(prompt, p, stream=False))
                    break
                except QueueFull:
                    pending = [h for h in handles if not h.done]
                    if pending:
                        try:
                            pending[0].result(timeout=QUEUE_FULL_WAIT_S)
                        except TimeoutError:
                            pass
                    else:
                        time.sleep(QUEUE_FULL_NAP_S)
        return [h.result() for h in handles]

    def save_prefix(self, prompt: Prompt, *, timeout: float | None = None) -> Result:
        """Evaluate `prompt` and save its KV to the engine's disk prefix store (a warm-up for a
        known instruction): later requests starting with it, in this process or a later one,
        restore it instead of evaluating it. The Result's `stored_prefix` names the entry; it is
        None when the engine has no store (EngineConfig.prefix_store) or its model cannot keep
        one. Samples one token (greedy) that nobody needs: the prompt's last token must be
        evaluated for the slot to hold all of it."""
        params = self.default_params.replace(max_tokens=1, min_tokens=0, temperature=0.0, n=1, logprobs=None,
                                             grammar=None, json_schema=None, stop=[], store_prefix=True,
                                             timeout=timeout)
        return self.submit(prompt, params, stream=False).result()


    def submit_embedding(self, inputs: Any, *, pooling: str | None = None, normalize: bool = True,
                         truncate: bool = False, timeout: float | None = None, dimensions: int | None = None,
                         callback: EventCallback | None = None) -> RequestHandle:
        """Queue one embeddings request: `inputs` is a string, a list of strings, a list of
        token ids or a list of those. Its handle's result() is an EmbeddingResult (vectors in
        input order, finish_reason "stop"; or error, cancelled, timeout), exactly once."""
        return self._submit_embed(EmbedRequest(inputs, pooling, normalize, truncate, timeout, dimensions), callback)

    def _submit_embed(self, request: EmbedRequest, callback: EventCallback | None) -> RequestHandle:
        # An engine that serves no embeddings (the Ray pool): every request is that one error.
        handle = RequestHandle(None, -1, False, callback)
        handle.kind = "embed"
        handle._finish(EmbeddingResult.ended(error_result(
            -1, f"embeddings are not served by {type(self).__name__}; use Engine or SupervisedEngine "
                "(run without --ray)", "unsupported")))
        return handle

    def embed(self, inputs: Any, *, pooling: str | None = None, normalize: bool = True,
              truncate: bool = False, dimensions: int | None = None) -> list[Embedding]:
        """The vectors of `inputs` (one Embedding per input, in order). Raises EmbeddingFailed
        (a LlamaBatchError carrying the request's code) when the request ends without them."""
        result = self.submit_embedding(inputs, pooling=pooling, normalize=normalize, truncate=truncate,
                                       dimensions=dimensions).result()
        if not result.ok:
            raise EmbeddingFailed(result.error or f"embeddings request ended: {result.finish_reason}",
                                  result.error_code or result.finish_reason)
        return result.embeddings


class EmbeddingFailed(LlamaBatchError):
    """engine.embed's request ended without vectors (bad input, cancelled, timeout, a failed decode)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def check_room(in_flight: int, n_slots: int, max_queue: int) -> None:
    """max_queue admission: raise QueueFull when `in_flight` requests (every one without an
    outcome, running or waiting) already fill the slots plus `max_queue`; 0 = no bound.

    Counting every request in flight, not the ones the engine has not taken yet, keeps the
    answer independent of thread timing (a request an idle slot is about to take still counts)."""
    if max_queue and in_flight >= n_slots + max_queue:
        raise QueueFull(f"queue is full ({max_queue} requests waiting)")


def ended_result(request_id: int, reason: str, *, seed: int | None = None, error: str | None = None,
                 code: str | None = None, deterministic: bool = False) -> Result:
    """The Result of a request that ends without output: cancelled before it ran, refused, lost."""
    return Result(request_id, "", [], reason, Usage(), Timings(), seed=seed, error=error, error_code=code,
                  deterministic=deterministic)


def error_result(request_id: int, message: str, code: str, *, seed: int | None = None,
                 deterministic: bool = False) -> Result:
    return ended_result(request_id, "error", seed=seed, error=message, code=code, deterministic=deterministic)


def record_outcome(telemetry: Telemetry, result: Result) -> None:
    """The telemetry of a request's one terminal Result ("exception" for errors, else "done")."""
    kind = "exception" if result.finish_reason == "error" else "done"
    telemetry.record_request(RequestRecord(kind, result.request_id, result.finish_reason, result.usage,
                                           result.timings, result.error,
                                           grammar_backend=getattr(result, "grammar_backend", None)))


MAX_PIECE_TOKENS = 1 << 20  # token ids one token_pieces call may name (a 16 MiB body holds ~2M short ids)


def checked_token_ids(tokens: Any, n_vocab: int) -> list[int]:
    """`tokens` as token ids of a model with `n_vocab` of them; InvalidRequest (one line
    naming the first wrong one) for anything else."""
    if not isinstance(tokens, (list, tuple)):
        raise InvalidRequest(f"tokens must be a list of token ids, got {type(tokens).__name__}")
    if len(tokens) > MAX_PIECE_TOKENS:
        raise InvalidRequest(f"tokens has {len(tokens)} ids; at most {MAX_PIECE_TOKENS} a request")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise InvalidRequest(f"tokens[{i}] = {str(t)[:40]} is not a token id of this model (0..{n_vocab - 1})")
    return list(tokens)
