"""A logits row sampled away from the llama context, on a sampling thread (see sampling_threads.py).

`llama_sampler_sample(chain, ctx, row)` reads the context's logits, which the next
llama_decode overwrites, so a row sampled while the engine decodes on is first copied
(n_vocab floats: 1 MiB for Gemma 3). The job then does what llama_sampler_sample does —
candidates in token-id order, the chain's samplers applied in order, the selected token
accepted by the chain — with one difference: the grammar sampler, whose cost is the one
that can be large, runs over the candidates in slices of about SLICE_SECONDS each, and the
job checks in with `stop()` between slices (it says when to give up, and may hold the job
while the engine decodes). A grammar only removes candidates, each on its own, so slicing
gives the same result. The tokens are the ones inline sampling gives (tests/test_sample_apart_model.py).
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable

import numpy as np
from llama_cpp import llama_cpp as C

from ...core.plan import SampleStopped

SLICE_SECONDS = 0.002  # the grammar pass in pieces of about this long: a stop or a pause waits for one piece
FIRST_SLICE, MIN_SLICE, MAX_SLICE = 256, 4, 65536  # candidates; a piece's size follows the time the last took
# (a 10,000-string enum costs up to ~0.5 ms a candidate on a busy 2-CPU machine: pieces of a few)

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class RowJob:
    """Sample one chunk's row (and its n-request siblings') with their chains, off the tick."""

    def __init__(self, runner: Any, chunk: Any, row: int):
        self.runner = runner
        n = runner.n_vocab
        self.logits = np.ctypeslib.as_array(C.llama_get_logits_ith(runner.ctx, row), shape=(n,)).copy()
        self.targets = [(chunk.slot, chunk.sampler), *chunk.siblings]
        self.samplers = [sampler for _, sampler in self.targets]
        self.top_n = chunk.logprobs
        self.suppress_eog = chunk.suppress_eog

    def run(self, stop: Callable[[], bool]) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
        n = len(self.logits)
        data = (C.llama_token_data * n)()
        view = np.frombuffer(data, dtype=_TOKEN_DATA)
        sampled: dict[int, int] = {}
        logprobs: dict[int, dict[str, Any]] = {}
        for slot, sampler in self.targets:
            view["id"] = np.arange(n, dtype=np.int32)
            view["logit"] = self.logits
            view["p"] = 0.0
            if self.suppress_eog and sampler.no_eog_chain:  # as samplers.sample_row: the twin picks,
                tok = _sample(sampler.no_eog_chain, data, n, stop)  # the main chain is told
                C.llama_sampler_accept(sampler.chain, tok)
            else:
                tok = _sample(sampler.chain, data, n, stop)
            sampled[slot] = tok
            if self.top_n is not None:
                logprobs[slot] = self.runner.logprobs.from_logits(self.logits, tok, self.top_n,
                                                                  np.empty_like(self.logits),
                                                                  ctypes.create_string_buffer(256))
        return sampled, logprobs


def _sample(chain: Any, data: Any, n: int, stop: Callable[[], bool]) -> int:
    """llama_sampler_sample over `data` (n candidates, id order), the grammar pass sliced."""
    whole = C.llama_token_data_array(data, n, -1, False)
    base = ctypes.addressof(data)
    size = ctypes.sizeof(C.llama_token_data)
    for i in range(C.llama_sampler_chain_n(chain)):
        element = C.llama_sampler_chain_get(chain, i)
        if stop():
            raise SampleStopped()
        if C.llama_sampler_name(element) != b"grammar":
            C.llama_sampler_apply(element, ctypes.byref(whole))
            continue
        start, piece = 0, FIRST_SLICE
        while start < n:
            if stop():
                raise SampleStopped()
            count = min(piece, n - start)
            part = C.llama_token_data_array(ctypes.cast(base + start * size, ctypes.POINTER(C.llama_token_data)),
                                            count, -1, False)
            t0 = time.perf_counter()
            C.llama_sampler_apply(element, ctypes.byref(part))
            took = time.perf_counter() - t0
            start += count
            # the cost per candidate varies with the grammar's state: aim the next piece at SLICE_SECONDS
            piece = int(min(MAX_SLICE, max(MIN_SLICE, count * SLICE_SECONDS / max(took, 1e-6))))
    if not 0 <= whole.selected < whole.size:
        # llama_sampler_sample would abort the process here (GGML_ASSERT): end the request instead
        raise RuntimeError("the sampler chain selected no token")
    token = int(whole.data[whole.selected].id)
    C.llama_sampler_accept(chain, token)
    return token
