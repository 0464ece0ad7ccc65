"""The llamabatch command line in-process: `main(argv, Environment)` with streams of the
test's own and, when asked, an engine over the scripted fake runner (no model).

    result = invoke(["config", "show"])                      # like CliRunner().invoke
    result = invoke(["run", "-"], input="hi\n", runner=fake)  # `run` on the fake runner
    result = invoke(["run", "-"], input="hi\n", factory=FakeEngines(fake, [], supervise=True))

stdin, stdout and stderr are temporary files (commands that read or write raw fds, such
as serve-stdin, need real descriptors); they are read back as text when the command ends.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from llamabatch import Engine
from llamabatch.cli.app import main
from llamabatch.cli.env import Environment
from llamabatch.llama import autoslots
from llamabatch.engines import EngineFactory

import supervised_child_runner
from child_tools import with_tests_on_path
from fake_runner import FakeRunner


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    engines: list[Engine]  # the engines the command built (fake factories only)

    @property
    def output(self) -> str:
        return self.stdout


# What the fake chooser "measures" for n_parallel auto (decode tok/s per slot count): 16 slots
# win (the smallest count within 5% of the best), unless something bounds them lower.
FAKE_MEASURED = {4: 100.0, 8: 170.0, 16: 190.0, 24: 195.0, 32: 150.0}


class FakeEngines(EngineFactory):
    """The CLI's engine factory with the scripted fake runner in place of the model.

    Everything else is the real factory's: the settings the command resolved, the model
    check, n_parallel "auto" chosen by autoslots' own bounds and pick (over FAKE_MEASURED:
    nothing is measured or cached), and with `supervise` a real SupervisedEngine whose
    child runs the runner registered as `child_runner` (tests/supervised_child_runner.py)
    instead of loading the model. Without `supervise`, --isolate engines run in this
    process (milliseconds)."""

    def __init__(self, make_runner: Callable[..., FakeRunner], engines: list, *, supervise: bool = False,
                 child_runner: str = "fake"):
        self.make_runner = make_runner
        self.engines = engines
        self.supervise = supervise
        self.child_runner = child_runner
        self.slot_choices: list[tuple[int | None, int]] = []  # (max_slots, chosen) per auto choice

    def open(self, resolved, *, isolated=False, watchdog_s=None):
        engine = super().open(resolved, isolated=isolated and self.supervise, watchdog_s=watchdog_s)
        self.engines.append(engine)
        return engine

    def choose_slots(self, config, model_path, max_slots):
        if max_slots is not None and max_slots <= 1:
            choice = autoslots.Choice(1, "auto: bounded by 1 input line", {})
        else:
            limit, why = autoslots.bounds(config, None, None, max_slots)
            n = autoslots.pick(FAKE_MEASURED, limit)
            choice = autoslots.Choice(n, autoslots.describe(n, FAKE_MEASURED, why, limit), dict(FAKE_MEASURED))
        self.slot_choices.append((max_slots, choice.n_parallel))
        return choice

    def load_runner(self, config):
        runner = self.make_runner(config)
        if runner.n_batch is None:
            runner.n_batch = config.n_batch
        return runner

    def in_process(self, resolved):
        # The CLI resolved --model (the bundled file) and named it; the fake runner stands in
        # for that model, so records name the fake, as they would name whatever really loaded.
        return super().in_process(resolved.replace(engine=resolved.engine.replace(model_name=None)))

    def runner_choice(self):
        return supervised_child_runner.choice(self.child_runner)

    def child_environment(self):
        return with_tests_on_path(dict(os.environ))


def fake_factory(make_runner: Callable[..., FakeRunner], engines: list, **kw) -> FakeEngines:
    """An Environment.engine_factory that builds the engine over `make_runner(config)`."""
    return FakeEngines(make_runner, engines, **kw)


def runner_for(reply: Callable[[str], str] | None = None, **kw) -> Callable[..., FakeRunner]:
    """A FakeRunner shaped like the config (slots, slot size), replying with `reply`."""
    return lambda config: FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, reply=reply, **kw)


@contextmanager
def _environ(overrides: Mapping[str, str] | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in overrides or {}}
    os.environ.update(overrides or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def invoke(args: Sequence[str], input: str | bytes = "", *, runner: Callable[..., FakeRunner] | None = None,
           env: Mapping[str, str] | None = None, stdin_isatty: bool = False, stdout_isatty: bool = False,
           stderr_isatty: bool = False, factory: EngineFactory | None = None) -> Outcome:
    """`runner`: the engine over that fake runner (FakeEngines), or `factory`: that factory
    (e.g. FakeEngines(..., supervise=True)); neither: the real one, which loads the model."""
    engines: list[Engine] = []
    with tempfile.TemporaryFile("w+b") as fin, tempfile.TemporaryFile("w+b") as fout, \
            tempfile.TemporaryFile("w+b") as ferr:
        fin.write(input.encode("utf-8") if isinstance(input, str) else input)
        fin.seek(0)
        stdin = open(fin.fileno(), "r", encoding="utf-8", closefd=False)
        stdout = open(fout.fileno(), "w", encoding="utf-8", closefd=False)
        stderr = open(ferr.fileno(), "w", encoding="utf-8", closefd=False)
        environment = Environment(stdin, stdout, stderr, stdin_isatty=stdin_isatty, stdout_isatty=stdout_isatty,
                                  stderr_isatty=stderr_isatty)
        if factory is not None:
            environment.engine_factory = factory
            engines = factory.engines if isinstance(factory, FakeEngines) else engines
        elif runner is not None:
            environment.engine_factory = fake_factory(runner, engines)
        with _environ(env):
            code = main(list(args), environment)
        for stream in (stdout, stderr):
            stream.flush()
        fout.seek(0)
        ferr.seek(0)
        return Outcome(code, fout.read().decode("utf-8", "replace"), ferr.read().decode("utf-8", "replace"), engines)
