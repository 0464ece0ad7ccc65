"""How llama.cpp splits one llama_batch into ubatches (graph runs), mirrored in Python so
each tick's telemetry can say how many graph runs its llama_decode made.

Mirrors llama.cpp (vendored in llama-cpp-python 0.3.36) src/llama-kv-cache-iswa.cpp
init_batch and src/llama-batch.cpp split_simple / split_equal, for batches whose rows each
belong to one sequence and whose sequences each occupy one run of consecutive rows (what
runner.execute builds: one chunk per slot):

- unified KV (one stream): split_simple, n_ubatch rows at a time in batch order;
- a KV stream per sequence: split_equal(sequential=True). Each ubatch takes sequences in
  batch order while their ids are consecutive (id == previous id + 1), then the same number
  of rows from each: as many as the shortest remainder allows, at most n_ubatch / n_seqs
  (at least one). So a tick of 7 decode rows and a 256-token prefill is two graph runs when
  the slots are consecutive and in order, and more when they are not.

tests/test_ubatch_split_model.py checks this mirror against llama.cpp's own graph runs.
"""
from __future__ import annotations

from typing import Sequence


def ubatch_sizes(runs: Sequence[tuple[int, int]], n_ubatch: int, unified: bool) -> list[int]:
    """Rows of each ubatch llama.cpp makes of a batch given as runs (seq_id, n_rows) in batch
    order, one run per sequence."""
    total = sum(n for _, n in runs)
    if n_ubatch <= 0 or total == 0:
        return []
    if unified:
        return [min(n_ubatch, total - start) for start in range(0, total, n_ubatch)]
    remaining = [n for _, n in runs]
    sizes = []
    while True:
        members: list[int] = []  # indexes into runs
        last = None
        for i, (seq_id, _) in enumerate(runs):
            if remaining[i] == 0:
                continue
            if members and seq_id != last + 1:  # sequential: only increasing, consecutive ids
                continue
            members.append(i)
            last = seq_id
            if len(members) > n_ubatch:
                break
        if not members:
            return sizes
        rounds = max(1, min(min(remaining[i] for i in members), n_ubatch // len(members)))
        for i in members:
            remaining[i] -= rounds
        sizes.append(rounds * len(members))
