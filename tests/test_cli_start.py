"""The `llamabatch` command starts without loading what it is not about to run.

Every command line (and every shell completion, which runs the program once per Tab) imports the
command tree first. When the package root imported the engine and each command module its
implementation at the top, `llamabatch --help` took 0.45-0.65 s here, nearly all of it imports
(numpy through the scheduler, the jobs package, prompt_toolkit); commands now import those when
they run. Checked in a fresh interpreter, since this test process has imported everything.
"""
from __future__ import annotations

import json
import subprocess
import sys

from test_help_pages import PATHS

# What a command loads only once it runs: the engine (numpy comes with its scheduler), llama.cpp,
# the jobs package, the chat library (prompt_toolkit), the HTTP server.
HEAVY = ("numpy", "llama_cpp", "llamabatch.engines", "llamabatch.core.engine", "llamabatch.in_process.engine",
         "llamabatch.supervised.engine", "llamabatch.jobs", "llamabatch.chat", "prompt_toolkit", "starlette")

SHOW_EVERY_HELP = """
import contextlib, io, json, sys
from llamabatch.cli.app import main
codes = []
for path in json.loads(sys.argv[1]):
    page = io.StringIO()
    with contextlib.redirect_stdout(page):  # click writes help pages to sys.stdout
        codes.append(main([*path, "--help"]))
    assert "Usage" in page.getvalue(), path
heavy = json.loads(sys.argv[2])
print(json.dumps({"codes": codes, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def fresh_python(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_help_page_renders_without_loading_the_engine_jobs_or_chat():
    shown = fresh_python(SHOW_EVERY_HELP, json.dumps([list(p) for p in PATHS]), json.dumps(HEAVY))
    assert shown["codes"] == [0] * len(PATHS)
    assert shown["loaded"] == []


def test_importing_the_package_loads_no_engine_until_engine_is_named():
    code = ("import json, sys, llamabatch\n"
            "before = [m for m in ('numpy', 'llamabatch.engines') if m in sys.modules]\n"
            "engine = llamabatch.Engine\n"
            "print(json.dumps({'before': before, 'engine': engine.__module__, "
            "'after': 'llamabatch.engines' in sys.modules, 'names': sorted(set(llamabatch.__all__) - set(dir(llamabatch)) - {'Engine', 'run_job', 'run_frame'})}))")
    seen = fresh_python(code)
    assert seen["before"] == []
    assert seen["engine"] == "llamabatch.in_process.engine"
    assert seen["after"] is True
    assert seen["names"] == []  # every other public name is there at import, as before
