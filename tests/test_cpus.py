"""llamabatch/checks/cpus.py: the CPUs a process may use, from its affinity and its cgroup's CPU
quota, read from cgroup trees laid out as the kernel does (v2's cpu.max, v1's cfs files)."""
from __future__ import annotations

import os

import pytest

from llamabatch.checks import cpus
from llamabatch.checks.cpus import cgroup_cpu_quota, usable_cpus
from llamabatch.config import EngineConfig


def tree(tmp_path, proc_cgroup: str, files: dict[str, str]):
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(proc_cgroup)
    return root, proc


@pytest.mark.parametrize("proc_cgroup, files, quota", [
    # cgroup v2: docker run --cpus 1.5 (rounded up), at the mount's root as a container sees it
    ("0::/\n", {"cpu.max": "150000 100000\n"}, 2),
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    # v2, the process's own cgroup below the root (a systemd slice); the root has no cpu.max
    ("0::/system.slice/job.service\n", {"system.slice/job.service/cpu.max": "100000 100000\n"}, 1),
    # v1: the cpu controller's hierarchy, mounted as cpu,cpuacct
    ("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
                                                 "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, 3),
    ("3:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
    # nothing readable: no quota, never an error
    ("0::/\n", {}, None),
    ("garbage\n", {"cpu.max": "not numbers\n"}, None),
])
def test_a_cgroup_quota_is_read_in_whole_cpus(tmp_path, proc_cgroup, files, quota):
    root, proc = tree(tmp_path, proc_cgroup, files)
    assert cgroup_cpu_quota(root, proc) == quota


def test_the_quota_caps_the_affinity_and_so_the_default_threads(monkeypatch):
    allowed = len(os.sched_getaffinity(0))
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 1)
    assert usable_cpus() == 1 and EngineConfig().n_threads == 1 and EngineConfig(threads=4).n_threads == 4
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: None)
    assert usable_cpus() == allowed
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: allowed + 8)  # a quota above the affinity
    assert usable_cpus() == allowed


def test_this_machines_own_cgroup_reads_without_error():
    quota = cgroup_cpu_quota()
    assert quota is None or quota >= 1
