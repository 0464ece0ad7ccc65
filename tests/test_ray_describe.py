"""What run --ray says about its engines (cluster/describe.py), without Ray: one count for
all when every worker was given the same, each worker's own choice and why with `auto`."""
from __future__ import annotations

from llamabatch.cluster.describe import header, slots_note
from llamabatch.cluster.dispatch import WorkerState
from llamabatch.cluster.plan import WorkerTally


def worker(name: str, n: int, slot_ctx: int, reason: str = "", node_id: str = "") -> WorkerState:
    return WorkerState(WorkerTally(name, "10.0.0.1", 1, 2), 2 * n, n, slot_ctx=slot_ctx, slots_reason=reason,
                       node_id=node_id)


def test_given_counts_keep_the_one_line_header():
    workers = [worker("w1", 4, 256), worker("w2", 4, 256)]
    assert header("gemma", workers, "a local Ray instance") == \
        "gemma, 2 engine(s) x 4 slots x 256 tokens on a local Ray instance: w1 on 10.0.0.1, w2 on 10.0.0.1"
    assert slots_note(workers[0]) == "4 slots"


def test_auto_names_each_workers_choice_and_why():
    workers = [worker("w1", 8, 4096, "auto: 1.40x over 8 here"), worker("w2", 6, 4096, "auto: bounded by 6 input lines")]
    assert header("gemma", workers, "Ray cluster 10.0.0.1:6379") == (
        "gemma, 2 engine(s) (w1: 8 slots x 4096 tokens, auto: 1.40x over 8 here; "
        "w2: 6 slots x 4096 tokens, auto: bounded by 6 input lines) on Ray cluster 10.0.0.1:6379: "
        "w1 on 10.0.0.1, w2 on 10.0.0.1")
    assert slots_note(workers[1]) == "6 slots (auto: bounded by 6 input lines)"


def test_the_header_names_each_worker_its_node_and_the_nodes_id():
    a, b = "5f0c2a9e41b7" + "0" * 44, "a1b2c3d4e5f6" + "1" * 44
    workers = [worker("w1", 4, 256, node_id=a), worker("w2", 4, 256, node_id=b)]
    workers[1].tally.node = "10.0.0.2"
    workers[1].reserved = 1
    assert header("gemma", workers, "Ray cluster 10.0.0.1:6379") == (
        "gemma, 2 engine(s) (w1: 4 slots x 256 tokens; w2: 3 slots + 1 for online requests x 256 tokens) on "
        "Ray cluster 10.0.0.1:6379: w1 on 10.0.0.1 (node 5f0c2a9e41b7), w2 on 10.0.0.2 (node a1b2c3d4e5f6)")
