"""How many CPUs this process may use: the default thread count (config.py) and the checks
against it. os.cpu_count() counts the machine's CPUs whatever the process may run on.

Two limits apply: the CPU affinity (`taskset`, a container's cpuset) and a cgroup's CPU quota
(`docker run --cpus 2`, a Kubernetes CPU limit), which lets the process run that many CPUs' worth
of time spread over more. llama.cpp's threads wait for each other at every graph node, so a
thread beyond either limit holds the others up.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this OS
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return min(cpus, quota) if quota else cpus


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The CPU quota of this process's cgroup in whole CPUs (rounded up), None where there is
    none or it cannot be read. cgroup v2: `cpu.max` ("QUOTA PERIOD" or "max PERIOD"); v1: the
    cpu controller's `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`. The process's own
    cgroup first (a systemd slice), then the mount's root (a container sees its own there)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2
            found = _quota(root / relative / "cpu.max", None) or _quota(root / "cpu.max", None)
        elif "cpu" in controllers.split(","):  # cgroup v1, the cpu controller's hierarchy
            folder = root / controllers
            found = _quota(folder / relative / "cpu.cfs_quota_us", folder / relative / "cpu.cfs_period_us") \
                or _quota(folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us")
        else:
            continue
        if found:
            return found
    return None


def _quota(quota_file: Path, period_file: Path | None) -> int | None:
    try:
        words = quota_file.read_text().split()
        if period_file is not None:
            words = words[:1] + period_file.read_text().split()[:1]
        quota, period = int(words[0]), int(words[1])
    except (OSError, ValueError, IndexError):  # "max", missing, unreadable
        return None
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None
