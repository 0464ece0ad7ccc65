"""The poison-line rule: after a worker process dies, who is retried, how, and who is to blame.

One rule for every place that runs requests in a process that can die: the supervised
engine's child process (`llamabatch.supervised`) and the Ray workers of `run --ray`. It is
pure bookkeeping over hashable request keys (no processes, threads or clocks), so both
front ends share it and tests drive it with a simulated worker.

The rule
--------
- A crash implicates every request that was in flight in the dead worker: each one's crash
  count goes up by one. Requests waiting outside the worker are not implicated.
- The implicated requests become *suspects* and are retried in *quarantine*: in groups, one
  group at a time per worker, with nothing else in that worker. A group that finishes
  clears its members; a group that crashes again narrows the search.
- A request is declared poison when it has been in flight in `max_crashes` (2) crashes and
  it was alone in the worker at the last one. The "alone" part keeps innocents safe: with
  groups, an innocent that shared a group with the poison line has also seen 2 crashes, so
  instead of being blamed it is retried alone (and then finishes normally).
- Group size: suspects with fewer than `max_crashes` crashes go in groups of about the
  square root of their number (at most `max_group`); those at `max_crashes` or more run
  alone. One poison line among S suspects therefore costs at most 3 crashes and about 2*sqrt(S)
  short quarantine runs, instead of S runs one by one.

Using it (single worker: the supervised engine)
-----------------------------------------------
    rule = PoisonRule()
    # the worker died with keys [a, b, c, ...] in flight:
    verdict = rule.crashed(in_flight_keys)
    for key in verdict.poisoned: answer it with an `engine_crashed` error (never retry it)
    # verdict.retry are now held by the rule as suspect groups
    # with a fresh worker: while rule.quarantining, send no fresh work; whenever no suspect is
    # in flight, send `group = rule.next_group()` (alone).  Every request that gets its
    # terminal outcome (done, error, cancelled): rule.finished(key) - also for requests the
    # caller cancels while the rule still holds them (they leave their group).
    # When rule.quarantining turns False, fresh work flows again.

Several workers (Ray): call `crashed` with the dead worker's in-flight keys, give each
`next_group()` to a worker that has nothing else in flight, and keep fresh work off those
workers until their group has finished; the other workers keep serving fresh requests.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Hashable, Iterable, TypeVar

K = TypeVar("K", bound=Hashable)

MAX_CRASHES = 2  # a request in flight in this many crashes (alone at the last) is poison
MAX_GROUP = 8  # the largest quarantine group


@dataclass
class Verdict(Generic[K]):
    """What one crash decided."""

    poisoned: list[K] = field(default_factory=list)  # answer these with an error now; never retry them
    retry: list[K] = field(default_factory=list)  # held by the rule as suspects, handed out by next_group()


class PoisonRule(Generic[K]):
    """Crash counts of requests in flight, and the quarantine groups that find the poison line."""

    def __init__(self, max_crashes: int = MAX_CRASHES, max_group: int = MAX_GROUP):
        if max_crashes < 1 or max_group < 1:
            raise ValueError("max_crashes and max_group must be >= 1")
        self.max_crashes = max_crashes
        self.max_group = max_group
        self.crash_total = 0  # crashes reported so far
        self.isolated: list[K] = []  # keys declared poison, in the order they were
        self._crashes: dict[K, int] = {}  # keys that were in flight in a crash and have no outcome yet
        self._groups: deque[list[K]] = deque()  # suspect groups waiting for a worker
        self._running: set[K] = set()  # suspects handed out by next_group(), not finished yet

    # -- questions ----------------------------------------------------------------------------

    @property
    def quarantining(self) -> bool:
        """Suspects are waiting or running: a single worker must not take fresh work now."""
        return bool(self._groups or self._running)

    @property
    def groups_waiting(self) -> int:
        return len(self._groups)

    def crashes(self, key: K) -> int:
        """How many crashes `key` was in flight in (0 once it has finished)."""
        return self._crashes.get(key, 0)

    def is_suspect(self, key: K) -> bool:
        return key in self._crashes

    # -- events -------------------------------------------------------------------------------

    def crashed(self, in_flight: Iterable[K]) -> Verdict[K]:
        """The worker died with `in_flight` (its requests without an outcome, in a stable order)."""
        keys = list(dict.fromkeys(in_flight))
        self.crash_total += 1
        for key in keys:
            self._crashes[key] = self._crashes.get(key, 0) + 1
            self._running.discard(key)
        if len(keys) == 1 and self._crashes[keys[0]] >= self.max_crashes:
            key = keys[0]
            del self._crashes[key]
            self.isolated.append(key)
            return Verdict(poisoned=[key])
        heavy = [k for k in keys if self._crashes[k] >= self.max_crashes]
        light = [k for k in keys if self._crashes[k] < self.max_crashes]
        for key in heavy:  # seen enough crashes: only a crash alone can convict it
            self._groups.append([key])
        size = min(self.max_group, max(1, math.isqrt(len(light) - 1) + 1)) if light else 1  # ceil(sqrt(n))
        for start in range(0, len(light), size):
            self._groups.append(light[start:start + size])
        return Verdict(retry=keys)

    def next_group(self) -> list[K]:
        """The next suspect group to run alone in a worker ([] when none is waiting)."""
        if not self._groups:
            return []
        group = self._groups.popleft()
        self._running.update(group)
        return group

    def finished(self, key: K) -> None:
        """`key` has its terminal outcome (or was cancelled while held): it is no longer a suspect."""
        if key not in self._crashes:
            return
        del self._crashes[key]
        self._running.discard(key)
        for group in self._groups:
            if key in group:
                group.remove(key)
                if not group:
                    self._groups.remove(group)
                break
