"""Logprob records: the chosen token's log probability and the likeliest alternatives, from
a row's raw logits (the model's distribution, before temperature, penalties or grammar:
what OpenAI and vLLM report). Only requests that asked for logprobs get here."""
from __future__ import annotations

import math
from typing import Any

from llama_cpp import llama_cpp as C

from ..vocab import Vocabulary


class LogprobReporter:
    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.n_vocab = vocab.n_tokens
        self._tokens: dict[int, tuple[str, list[int]]] = {}  # token -> (text, bytes)
        self._scratch: Any = None  # a float32 buffer of n_vocab, made on the first request

    def from_row(self, ctx: Any, row: int, chosen: int, top_n: int) -> dict[str, Any]:
        """The record for logits row `row` of the context. Whole-vocabulary passes run in
        numpy, over a view of llama.cpp's logits buffer (no copy); Python touches only the k
        tokens it reports. The engine thread's own scratch buffers."""
        import numpy as np

        logits = np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,))
        if self._scratch is None:
            self._scratch = np.empty(self.n_vocab, dtype=np.float32)
        return self.from_logits(logits, chosen, top_n, self._scratch, None)

    def from_logits(self, logits: Any, chosen: int, top_n: int, scratch: Any, piece_buf: Any) -> dict[str, Any]:
        """`from_row` over a logits array (numpy, n_vocab floats), with the caller's own
        scratch array and piece buffer: a sampling thread (row_job.py) calls it too."""
        import numpy as np

        mx = float(logits.max())
        np.subtract(logits, mx, out=scratch)
        np.exp(scratch, out=scratch)
        logz = mx + math.log(float(scratch.sum(dtype=np.float64)))
        out = self._entry(chosen, float(logits[chosen]) - logz, piece_buf)
        top: list[dict[str, Any]] = []
        if top_n:
            ids = np.argpartition(logits, self.n_vocab - top_n)[self.n_vocab - top_n:]
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            top = [self._entry(int(t), float(logits[t]) - logz, piece_buf) for t in ids]
        out["top_logprobs"] = top
        return out

    def _entry(self, token: int, logprob: float, piece_buf: Any) -> dict[str, Any]:
        # The token as text and its bytes (a token can hold part of a UTF-8 character: its text
        # then shows U+FFFD and `bytes` has the truth). Control tokens show their name.
        info = self._tokens.get(token)
        if info is None:
            data = self.vocab.piece(token, special=True, buf=piece_buf)
            info = self._tokens[token] = (data.decode("utf-8", "replace"), list(data))
        return {"token": info[0], "id": token, "logprob": logprob, "bytes": list(info[1])}
