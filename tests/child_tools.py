"""Helpers for tests that start the supervised engine's child with a fake runner and no model.

The parent only checks that the model file starts with the GGUF magic (the child, running a
fake runner, never opens it), so these tests need no model and belong to the fast suite.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)  # where the child imports the registered runners from


def fake_gguf(folder: Path) -> str:
    path = folder / "fake.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    return str(path)


def with_tests_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with tests/ first in PYTHONPATH: a child imports supervised_child_runner from there."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (TESTS, env.get("PYTHONPATH", "")) if p)}


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a supervised child (or of a process that starts one) running a
    registered runner (supervised_child_runner.choice): no LLAMABATCH_MODEL, tests/ importable."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMABATCH_MODEL"}
    env.update(extra)
    return with_tests_on_path(env)


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def is_gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for a reaper (it runs nothing and holds no memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.05)
    return is_gone(pid)


def engine_children(pid: int) -> list[int]:
    """The supervised engine's child processes among `pid`'s children."""
    found = []
    for child in children_of(pid):
        try:
            if b"engine-child" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            pass
    return found


def wait_for_engine_child(pid: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = engine_children(pid)
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no engine child in {timeout}s")
