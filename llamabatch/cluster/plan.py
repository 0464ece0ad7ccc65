"""Where the engines of `run --ray` go, and what each one did: plain data, no ray import.

`place_workers` turns the cluster's nodes and the --ray-* flags into one placement per
engine (node, CPUs = llama.cpp threads, GPUs). `WorkerTally` counts what a worker did for
progress and the summary. Both are pure so they are unit-tested without a cluster.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


class PlacementError(Exception):
    """The cluster can't hold the engines asked for: one line for the user."""


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str  # the node's IP, what people call it
    cpus: int
    gpus: float = 0.0


@dataclass(frozen=True)
class Placement:
    node: Node
    cpus: int  # Ray's CPU reservation, and the engine's llama.cpp threads
    gpus: float


def place_workers(nodes: list[Node], workers: int | None, cpus: int | None, gpus: float) -> list[Placement]:
    """One Placement per engine, spread over the nodes round-robin.

    Defaults: one engine per node that has the CPUs (and GPUs) asked for; each engine takes
    `cpus` CPUs, or when not given an equal share of its node's CPUs (all of them with one
    engine per node).
    """
    usable = [n for n in nodes if n.cpus >= (cpus or 1) and n.gpus >= gpus]
    if not usable:
        need = f"{cpus or 1} CPU(s)" + (f" and {gpus:g} GPU(s)" if gpus else "")
        have = ", ".join(f"{n.address}: {n.cpus} CPU(s), {n.gpus:g} GPU(s)" for n in nodes) or "no nodes"
        raise PlacementError(f"no Ray node has {need} for an engine ({have})")
    usable.sort(key=lambda n: (-n.cpus, n.address))
    count = workers if workers is not None else len(usable)

    def room(node: Node) -> int:  # engines a node can hold
        by_cpu = node.cpus // (cpus or 1)
        by_gpu = int(node.gpus // gpus) if gpus else by_cpu
        return min(by_cpu, by_gpu)

    per_node = {n.node_id: 0 for n in usable}
    placed = 0
    while placed < count:
        progressed = False
        for node in usable:
            if placed < count and per_node[node.node_id] < room(node):
                per_node[node.node_id] += 1
                placed += 1
                progressed = True
        if not progressed:
            total = sum(room(n) for n in usable)
            raise PlacementError(f"the cluster holds {total} engine(s) of {cpus or 1} CPU(s)"
                                 + (f" and {gpus:g} GPU(s)" if gpus else "") + f", not {count}: "
                                 "use fewer --ray-workers or fewer --ray-cpus-per-worker")
    placements = []
    for node in usable:
        k = per_node[node.node_id]
        for _ in range(k):
            placements.append(Placement(node, cpus if cpus else max(1, node.cpus // k), gpus))
    # Interleave nodes so engine 1, 2, ... sit on different nodes, as people read the summary.
    by_node: dict[str, list[Placement]] = {}
    for p in placements:
        by_node.setdefault(p.node.node_id, []).append(p)
    ordered: list[Placement] = []
    while any(by_node.values()):
        for queue in by_node.values():
            if queue:
                ordered.append(queue.pop(0))
    return ordered


@dataclass
class WorkerTally:
    """What one engine did, seen from the driver."""

    name: str  # "w1", "w2", ... in start order
    node: str
    pid: int
    threads: int
    lines: int = 0  # lines it answered
    generated: int = 0  # tokens it generated for them
    retried_here: int = 0  # lines it ran again after another worker died with them
    inflight: int = 0
    restarts: int = 0  # times its process died and Ray started it again
    alive: bool = True
    died_with: int = 0  # lines in flight when it died (run again elsewhere)
    death: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def stop(self) -> None:
        self.ended = time.monotonic()

    def elapsed(self) -> float:
        return max((self.ended or time.monotonic()) - self.started, 1e-6)

    def progress(self) -> str:
        if not self.alive:
            return f"{self.name} lost"
        t = self.elapsed()
        return f"{self.name} {self.lines / t:.1f} lines/s {self.generated / t:.0f} tok/s"

    def summary(self) -> str:
        t = self.elapsed()
        line = (f"  {self.name} on {self.node} (pid {self.pid}, {self.threads} thread(s)): {self.lines} line(s), "
                f"{self.generated / t:.1f} generated tok/s, {self.retried_here} retried here")
        if self.restarts or not self.alive:
            line += (f"; died {self.restarts} time(s) with {self.died_with} line(s) in flight, run again "
                     f"({self.death})")
        if not self.alive:
            line += "; gone"
        return line
