"""Embedding requests: what a caller asks for, how it is checked, and how the engine packs
the inputs of many requests into each llama_decode. Never imports llama_cpp.

A request is a list of inputs (text or token ids); every input becomes one sequence of
the runner's embedding context, and one vector. The engine's embedding lane
(lanes/embedding_lane.py) takes a batch from the EmbedQueue each tick (FIFO over requests
and their inputs, up to the runner's token and sequence bounds), the runner evaluates it in
one llama_decode with pooling on and gives one vector per input, and a request ends once
its last input has its vector.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Union

from ..errors import ContextOverflow, InvalidRequest
from ..files.json_line import surrogate_at
from ..results import Embedding, EmbeddingResult, Timings, Usage
from .byte_bound import prefix_to_tokenize, too_long

POOLINGS = ("mean", "cls", "last")  # what --pooling may say (llama.cpp's pooling types that give a vector)
# The most inputs one request may carry, as OpenAI's /v1/embeddings (2048): a longer list is
# that request's error, not split (a line of 100,000 inputs would hold every vector of it in
# memory until its last one is done; split it into lines instead).
MAX_INPUTS = 2048

EmbedInput = Union[str, list[int]]


@dataclass(frozen=True)
class EmbedRequest:
    """An embeddings request as submitted (picklable: the supervised engine sends it to its child).

    `inputs`: a string, a list of strings, a list of token ids (one input), or a list of such
    lists; `pooling`: mean, cls or last (None: the engine's, which is the GGUF's own or mean);
    `normalize`: scale each vector to unit length (L2); `truncate`: keep the first tokens of
    an input longer than the embedding context instead of ending the request with an error;
    `dimensions`: keep the first this many components of each vector (before normalizing)."""

    inputs: Any
    pooling: str | None = None
    normalize: bool = True
    truncate: bool = False
    timeout: float | None = None
    dimensions: int | None = None  # keep the first this many components (then normalize): OpenAI's `dimensions`


def split_inputs(inputs: Any) -> list[EmbedInput]:
    """OpenAI's input shapes as one item per vector; InvalidRequest names the first bad one."""
    if isinstance(inputs, str):
        return [inputs]
    if not isinstance(inputs, (list, tuple)):
        raise InvalidRequest(f"input must be a string, a list of strings or token ids, got {type(inputs).__name__}")
    if not inputs:
        raise InvalidRequest("input is an empty list")
    if all(_is_token(t) for t in inputs):
        return [list(inputs)]  # one input given as token ids
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"input has {len(inputs)} items; at most {MAX_INPUTS} per request "
                             "(split them over several requests)")
    items: list[EmbedInput] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, (list, tuple)) and all(_is_token(t) for t in item):
            items.append(list(item))
        else:
            raise InvalidRequest(f"input[{i}] must be a string or a list of token ids, got {_kind(item)}")
    return items


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "a list holding " + ", ".join(sorted({type(v).__name__ for v in value}))
    return type(value).__name__


def input_tokens(runner: Any, item: EmbedInput, where: str, max_tokens: int, truncate: bool) -> list[int]:
    """The tokens one input is evaluated as (text gets the BOS token, as llama-server's
    embeddings do); InvalidRequest / ContextOverflow for bad input."""
    if isinstance(item, str):
        if not item:
            raise InvalidRequest(f"{where} is an empty string")
        bad = surrogate_at(item)
        if bad:
            raise InvalidRequest(f"{where} {bad}")
        size = None if truncate else too_long(runner, item, max_tokens)
        if size is not None:  # refused by its bytes, before tokenizing megabytes (core/byte_bound.py)
            raise ContextOverflow(f"{where} has {size:,} bytes, more than {max_tokens} tokens (n_batch) can hold; "
                                  f"pass truncate to keep the first {max_tokens}")
        tokens = runner.tokenize(prefix_to_tokenize(runner, item, max_tokens) if truncate else item, special=False)
    else:
        if not item:
            raise InvalidRequest(f"{where} is an empty list of token ids")
        for t in item:
            if t < 0 or t >= runner.n_vocab:
                raise InvalidRequest(f"{where}: token {t} is not a token id of this model (0..{runner.n_vocab - 1})")
        tokens = list(item)
    if len(tokens) > max_tokens:
        if not truncate:
            raise ContextOverflow(f"{where} has {len(tokens)} tokens but an embedding input may have at most "
                                  f"{max_tokens} (n_batch); pass truncate to keep the first {max_tokens}")
        tokens = tokens[:max_tokens]
    return tokens


def check_pooling(pooling: Any) -> str | None:
    if pooling is None or pooling in POOLINGS:
        return pooling
    raise InvalidRequest(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")


def prepare_job(runner: Any, request_id: int, request: EmbedRequest) -> EmbedJob:
    """The EmbedJob for a request (caller's thread), or LlamaBatchError naming its first problem."""
    if runner.embed_refusal:
        raise InvalidRequest(runner.embed_refusal)
    pooling = check_pooling(request.pooling) or runner.default_pooling
    if pooling not in POOLINGS:
        raise InvalidRequest(f"this model's GGUF asks for pooling {pooling!r} (a reranker: it scores pairs, "
                             f"it gives no embedding); name a pooling ({', '.join(POOLINGS)}) to pool its states")
    if request.timeout is not None and (isinstance(request.timeout, bool) or not isinstance(request.timeout, (int, float))
                                        or not request.timeout > 0):
        raise InvalidRequest(f"timeout must be a number of seconds > 0, got {request.timeout!r}")
    dims = request.dimensions
    if dims is not None and (not _is_token(dims) or not 0 < dims <= runner.n_embd):
        raise InvalidRequest(f"dimensions must be an integer in [1, {runner.n_embd}] (this model's vectors "
                             f"have {runner.n_embd}), got {dims!r}")
    items = split_inputs(request.inputs)
    tokens = [input_tokens(runner, item, f"input[{i}]" if len(items) > 1 else "input",
                           runner.embed_max_tokens, bool(request.truncate)) for i, item in enumerate(items)]
    now = time.perf_counter()
    return EmbedJob(request_id, tokens, pooling, bool(request.normalize), dimensions=dims, submitted_at=now,
                    deadline=None if request.timeout is None else now + request.timeout)


def unit(vector: list[float]) -> list[float]:
    """`vector` scaled to length 1 (L2), as llama-server's embd_normalize=2; a zero vector stays."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else list(vector)


@dataclass(eq=False)
class EmbedJob:
    """One accepted embeddings request on the engine thread: its inputs' tokens, the vectors
    so far, and how far its inputs have been handed out to batches."""

    request_id: int
    tokens: list[list[int]]
    pooling: str
    normalize: bool
    dimensions: int | None = None
    deadline: float | None = None
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    vectors: list[list[float] | None] = field(default_factory=list)
    next_input: int = 0  # inputs before this one are in a batch already
    finished: bool = False

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.tokens)

    def take_vector(self, index: int, raw: list[float]) -> None:
        """Input `index`'s pooled vector as the runner gave it: cut to `dimensions`, normalized."""
        vector = list(raw[:self.dimensions]) if self.dimensions else list(raw)
        self.vectors[index] = unit(vector) if self.normalize else vector

    @property
    def complete(self) -> bool:
        return all(v is not None for v in self.vectors)

    def result(self, deterministic: bool) -> EmbeddingResult:
        now = time.perf_counter()
        n = sum(len(t) for t in self.tokens)
        started = self.started_at or now
        timings = Timings(queue_ms=(started - self.submitted_at) * 1000, prompt_ms=(now - started) * 1000,
                          prompt_tokens_per_s=n / (now - started) if now > started else 0.0)
        embeddings = [Embedding(i, v, len(t)) for i, (v, t) in enumerate(zip(self.vectors, self.tokens))]
        return EmbeddingResult(self.request_id, embeddings, "stop", Usage(prompt_tokens=n), timings,
                               pooling=self.pooling, deterministic=deterministic)


@dataclass
class EmbedItem:
    job: EmbedJob
    index: int  # which of the job's inputs


class EmbedQueue:
    """Accepted embeddings requests, oldest first; `take` packs the next batch."""

    def __init__(self) -> None:
        self.jobs: deque[EmbedJob] = deque()

    def add(self, job: EmbedJob) -> None:
        self.jobs.append(job)

    def remove(self, job: EmbedJob) -> None:
        if job in self.jobs:
            self.jobs.remove(job)

    def has_work(self) -> bool:
        return any(j.next_input < len(j.tokens) for j in self.jobs)

    def expired(self, now: float) -> list[EmbedJob]:
        return [j for j in self.jobs if j.deadline is not None and now >= j.deadline]

    def next_deadline(self) -> float | None:
        return min((j.deadline for j in self.jobs if j.deadline is not None), default=None)

    def take(self, max_tokens: int, max_seqs: int) -> tuple[str, list[EmbedItem]]:
        """The next batch: inputs in FIFO order (requests, then their inputs) while they fit in
        `max_tokens` tokens and `max_seqs` sequences, all of one pooling (the oldest request's:
        a pooling type is a property of the embedding context). A first input always fits
        (inputs are at most max_tokens long)."""
        items: list[EmbedItem] = []
        pooling = ""
        used = 0
        for job in self.jobs:
            if job.next_input >= len(job.tokens):
                continue
            if not pooling:
                pooling = job.pooling
            elif job.pooling != pooling:
                continue  # a later batch, with its own context
            while job.next_input < len(job.tokens) and len(items) < max_seqs:
                n = len(job.tokens[job.next_input])
                if items and used + n > max_tokens:
                    return pooling, items
                items.append(EmbedItem(job, job.next_input))
                used += n
                job.next_input += 1
                if job.started_at is None:
                    job.started_at = time.perf_counter()
            if len(items) >= max_seqs:
                break
        return pooling, items
