"""Greedy sampling straight from the logits row, for chains that are only a logit bias and
llama.cpp's greedy sampler.

`llama_sampler_sample` first copies the whole row into a candidate array (id, logit, p for
each of Gemma 3's 262,144 tokens: 3 MiB), applies the chain, then scans it: 0.33 ms a row
on a 2-core EPYC, 4-5 ms of a ~76 ms decode tick of 8 rows. An argmax over the row in place
takes 0.04 ms (docs/performance.md, the KV layout section).

Same token as the chain, by construction:
- llama.cpp's greedy keeps the first index of the largest logit (`>` while scanning), as
  numpy's argmax does;
- the logit bias adds each bias to its token's logit in float32 (here too, on a copy of
  the row, when it could change the answer); when every bias is <= 0 and the raw argmax has
  none, no biased token can overtake or tie it from a lower index, so no copy is needed;
- greedy and logit bias keep no state, so skipping llama_sampler_accept changes nothing;
- a NaN anywhere the argmax could land is left to the chain (the two disagree on NaN).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np


class GreedyPick:
    def __init__(self, bias: Mapping[int, float]):
        self.ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.biased = frozenset(bias)
        self.only_down = bool((self.values <= 0).all())  # False for a NaN bias: the copy path, then the chain

    def pick(self, logits: np.ndarray) -> int | None:
        """The token the chain would pick from `logits` (float32, the whole vocabulary), or
        None when only the chain can tell (a NaN)."""
        best = int(logits.argmax())
        if self.biased and (best in self.biased or not self.only_down):
            row = logits.copy()
            row[self.ids] += self.values
            best = int(row.argmax())
            value = row[best]
        else:
            value = logits[best]
        return None if math.isnan(value) else best
