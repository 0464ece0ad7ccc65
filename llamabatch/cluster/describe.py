"""What `run --ray` says about its engines: the header line and each worker's start note.

Pure text from the workers' states (no ray import). With `--n-parallel auto` every worker
chooses its own slot count on its own node, so the header names each worker's choice and
why, instead of one count for all.
"""
from __future__ import annotations

from .dispatch import WorkerState


NODE_ID_CHARS = 12  # of Ray's 56-hex-digit node id: enough to tell a cluster's nodes apart


def header(model_name: str, workers: list[WorkerState], where: str) -> str:
    """"gemma, 2 engine(s) x 4 slots x 256 tokens on a local Ray instance: w1 on 10.0.0.1
    (node 5f0c2a9e41b7), w2 on ...", or with differing or auto-chosen counts, each worker's:
    "gemma, 2 engine(s) (w1: 8 slots x 4096 tokens, auto: bounded by 6 input lines; w2: ...)
    on ...: w1 on ...". What a run's first line and a job's manifest ("ray") say."""
    shapes = {(w.n_parallel, w.reserved, w.slot_ctx) for w in workers}
    if len(shapes) == 1 and not any(w.slots_reason for w in workers):
        n, reserved, ctx = shapes.pop()
        online = f" (+ {reserved} each for online requests)" if reserved else ""
        shape = f"{len(workers)} engine(s) x {n - reserved} slots x {ctx} tokens{online}"
    else:
        shape = f"{len(workers)} engine(s) (" + "; ".join(
            f"{w.tally.name}: {_slots(w)} x {w.slot_ctx} tokens" + (f", {w.slots_reason}" if w.slots_reason else "")
            for w in workers) + ")"
    return f"{model_name}, {shape} on {where}: " + ", ".join(where_is(w) for w in workers)


def where_is(worker: WorkerState) -> str:
    """"w1 on 10.0.0.1 (node 5f0c2a9e41b7)": the worker's name, its node's address and id."""
    node = f" (node {worker.node_id[:NODE_ID_CHARS]})" if worker.node_id else ""
    return f"{worker.tally.name} on {worker.tally.node}{node}"


def _slots(worker: WorkerState) -> str:
    """"8 slots", or with serve's --online-slots "8 slots + 1 for online requests"."""
    r = worker.reserved
    return f"{worker.batch_slots} slots" + (f" + {r} for online requests" if r else "")


def slots_note(worker: WorkerState) -> str:
    """The end of a worker's start note: "8 slots", or "8 slots (auto: 1.40x over 8 here)"."""
    return _slots(worker) + (f" ({worker.slots_reason})" if worker.slots_reason else "")


def worker_row(worker: WorkerState) -> dict:
    """One worker as serve's /health and /metrics show it."""
    t = worker.tally
    return {"name": t.name, "node": t.node, "pid": t.pid, "state": worker.state, "slots": worker.n_parallel,
            "inflight": len(worker.inflight), "lines": t.lines, "generated_tokens": t.generated,
            "restarts": t.restarts, "retried_here": t.retried_here}
