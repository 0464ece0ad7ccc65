"""The llamabatch command line in-process: `main(argv, Environment)` with streams of the
test's own and, when asked, an engine over the scripted fake runner (no model).

    result = invoke(["config", "show"])                      # like CliRunner().invoke
    result = invoke(["run", "-"], input="hi\n", runner=fake)  # `run` on the fake runner

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

from fake_runner import FakeRunner


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    engines: list[Engine]  # the engines the command built (fake runner only)

    @property
    def output(self) -> str:
        return self.stdout


def fake_factory(make_runner: Callable[..., FakeRunner], engines: list[Engine]):
    """An Environment.engine_factory that builds the engine over `make_runner(config)`."""
    def build(config, params):
        # The CLI resolved --model (the bundled file) and named it; the fake runner stands in
        # for that model, so records name the fake, as they would name whatever really loaded.
        config = config.replace(model_name=None)
        runner = make_runner(config)
        if runner.n_batch is None:
            runner.n_batch = config.n_batch
        engine = Engine(config, runner=runner, default_params=params)
        engines.append(engine)
        return engine
    return build


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
           stderr_isatty: bool = False) -> Outcome:
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
        if runner is not None:
            environment.engine_factory = fake_factory(runner, engines)
        with _environ(env):
            code = main(list(args), environment)
        for stream in (stdout, stderr):
            stream.flush()
        fout.seek(0)
        ferr.seek(0)
        return Outcome(code, fout.read().decode("utf-8", "replace"), ferr.read().decode("utf-8", "replace"), engines)
