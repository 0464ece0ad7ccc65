"""Placing `run --ray` engines on nodes, what a worker reports, the bare --ray flag, and --ray
without Ray installed: no cluster, no model."""
from __future__ import annotations

import subprocess
import sys

import pytest

from llamabatch.cli.run.ray_flag import with_bare_ray_flag
from llamabatch.cluster.plan import Node, PlacementError, WorkerTally, place_workers

A, B = Node("a", "10.0.0.1", 8), Node("b", "10.0.0.2", 4)


def where(placements):
    return [(p.node.address, p.cpus) for p in placements]


def test_default_is_one_engine_per_node_with_all_its_cpus():
    assert where(place_workers([B, A], None, None, 0)) == [("10.0.0.1", 8), ("10.0.0.2", 4)]


def test_explicit_workers_and_cpus_spread_round_robin():
    assert where(place_workers([A, B], 4, 2, 0)) == [("10.0.0.1", 2), ("10.0.0.2", 2), ("10.0.0.1", 2),
                                                     ("10.0.0.2", 2)]
    # B holds two engines of 2 CPUs, A four: the fifth and sixth go to A
    assert [p.node.address for p in place_workers([A, B], 6, 2, 0)].count("10.0.0.1") == 4


def test_workers_without_cpus_share_each_node():
    placed = where(place_workers([A, B], 3, None, 0))
    assert sorted(placed) == [("10.0.0.1", 4), ("10.0.0.1", 4), ("10.0.0.2", 4)]


def test_a_cluster_too_small_is_one_line():
    with pytest.raises(PlacementError, match="holds 6 engine"):
        place_workers([A, B], 7, 2, 0)
    with pytest.raises(PlacementError, match="no Ray node has 16 CPU"):
        place_workers([A, B], None, 16, 0)


def test_gpus_limit_placement():
    gpu = Node("g", "10.0.0.3", 8, 2.0)
    assert where(place_workers([A, gpu], None, None, 1.0)) == [("10.0.0.3", 8)]
    assert len(place_workers([A, gpu], 2, 1, 1.0)) == 2
    with pytest.raises(PlacementError, match="holds 2 engine"):
        place_workers([A, gpu], 3, 1, 1.0)


def test_worker_tally_lines():
    t = WorkerTally("w1", "10.0.0.1", 42, 2, lines=10, generated=300)
    assert t.progress().startswith("w1 ") and "lines/s" in t.progress()
    assert "10 line(s)" in t.summary() and "died" not in t.summary()
    t.restarts, t.died_with, t.death = 1, 3, "ActorDiedError: killed"
    assert "died 1 time(s) with 3 line(s) in flight" in t.summary()


@pytest.mark.parametrize("argv, expected", [
    (["run", "in.jsonl", "--ray"], ["run", "in.jsonl", "--ray=local"]),
    (["run", "--ray", "in.jsonl", "-o", "o"], ["run", "--ray=local", "in.jsonl", "-o", "o"]),
    (["run", "in.jsonl", "--ray", "-o", "o"], ["run", "in.jsonl", "--ray=local", "-o", "o"]),
    (["run", "in.jsonl", "--ray", "auto"], ["run", "in.jsonl", "--ray", "auto"]),
    (["run", "in.jsonl", "--ray", "10.0.0.1:6379"], ["run", "in.jsonl", "--ray", "10.0.0.1:6379"]),
    (["run", "in.jsonl", "--ray", "ray://head:10001"], ["run", "in.jsonl", "--ray", "ray://head:10001"]),
    (["run", "in.jsonl", "--ray=auto"], ["run", "in.jsonl", "--ray=auto"]),
    (["run", "--", "--ray"], ["run", "--", "--ray"]),
])
def test_bare_ray_flag_means_a_local_instance(argv, expected):
    assert with_bare_ray_flag(argv) == expected


def test_without_ray_installed_run_ray_exits_2_with_the_install_hint(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['llamabatch', 'run', sys.argv[1], '--ray']; "
            "from llamabatch.cli.app import main; sys.exit(main())")
    res = subprocess.run([sys.executable, "-c", code, str(inp)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "llamabatch: error: --ray needs Ray, which is not installed: pip install 'llamabatch[ray]'"]
    assert res.stdout == ""
