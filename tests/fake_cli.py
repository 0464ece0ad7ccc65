"""`python tests/fake_cli.py RUNNER ARGS...`: the llamabatch command line in a process of its
own whose engines run the registered runner RUNNER (supervised_child_runner.py) instead of
loading a model, in this process and in the supervised child.

For what only real processes show (signals, a stopped or killed child); the in-process
harness (cli_harness.invoke) covers the rest. The caller's environment comes from
child_tools.child_env, which puts tests/ on the child's PYTHONPATH.
"""
from __future__ import annotations

import os
import sys

from llamabatch.cli.app import main
from llamabatch.cli.env import Environment
from llamabatch.engines import EngineFactory

import supervised_child_runner
from child_tools import with_tests_on_path

PATH = os.path.abspath(__file__)


class RegisteredRunnerEngines(EngineFactory):
    """The real factory, except that every engine runs the registered runner `name`."""

    def __init__(self, name: str):
        self.name = name

    def runner_choice(self):
        return supervised_child_runner.choice(self.name)

    def child_environment(self):
        return with_tests_on_path(dict(os.environ))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[2:], Environment(engine_factory=RegisteredRunnerEngines(sys.argv[1]))))
