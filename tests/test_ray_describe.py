"""What run --ray says about its engines (cluster/describe.py), without Ray: one count for
all when every worker was given the same, each worker's own choice and why with `auto`."""
from __future__ import annotations

from llamabatch.cluster.describe import header, slots_note
from llamabatch.cluster.dispatch import WorkerState
from llamabatch.cluster.plan import WorkerTally


def worker(name: str, n: int, slot_ctx: int, reason: str = "") -> WorkerState:
    return WorkerState(WorkerTally(name, "10.0.0.1", 1, 2), 2 * n, n, slot_ctx=slot_ctx, slots_reason=reason)


def test_given_counts_keep_the_one_line_header():
    workers = [worker("w1", 4, 256), worker("w2", 4, 256)]
    assert header("gemma", workers, "a local Ray instance") == \
        "gemma, 2 engine(s) x 4 slots x 256 tokens on a local Ray instance"
    assert slots_note(workers[0]) == "4 slots"


def test_auto_names_each_workers_choice_and_why():
    workers = [worker("w1", 8, 4096, "auto: 1.40x over 8 here"), worker("w2", 6, 4096, "auto: bounded by 6 input lines")]
    assert header("gemma", workers, "Ray cluster 10.0.0.1:6379") == (
        "gemma, 2 engine(s) (w1: 8 slots x 4096 tokens, auto: 1.40x over 8 here; "
        "w2: 6 slots x 4096 tokens, auto: bounded by 6 input lines) on Ray cluster 10.0.0.1:6379")
    assert slots_note(workers[1]) == "6 slots (auto: bounded by 6 input lines)"
