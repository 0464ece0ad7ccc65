"""How far a reader follows the code: the llamabatch files a call path passes through, and how
often it comes back to a file it had left, traced with sys.setprofile.

    python benchmarks/call_paths.py            # both paths, on the bundled SmolLM2
    python benchmarks/call_paths.py --list     # and each path's files in the order first entered

- open_engine: `engines.open_engine(EngineConfig(...))` from its settings until the runner's
  constructor is entered (LlamaRunner.__init__);
- start_job: `jobs.start_job(INPUT, OUTPUT, ...)` from its input until it returns, the job open
  and its reader and starter threads started (they are not followed).

Each Python call and return inside llamabatch/ moves "the file being read" to the callee's or
the caller's file; a file is visited when first entered, and a return is counted each time the
reading moves back into a file it had already left. Calls outside llamabatch (the standard
library, llama_cpp) are not followed. It measures and prints; it asserts nothing.

Each path is counted twice:

- traced: every call and return as above, import-time module bodies included (the first
  `import llamabatch.llama` runs some 30 module bodies on the way to the runner);
- followed: what a reader following the path by hand reads. Module bodies run by an import
  are not followed (a reader reads the call, not the imported module's top level), and a
  leaf call, one that returns without calling further into llamabatch (an error's
  constructor, a property, a one-line check), is read where it is called: it is not counted
  as a move into its file and back; nor is a function already read on this path, called
  again (a loop's body for each line, a check made twice): the reader has read it. The
  path's end (the runner's constructor) always counts.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _bench import say

PACKAGE = str(Path(__file__).resolve().parent.parent / "llamabatch")


class Tracer:
    def __init__(self, stop_at: str = ""):
        self.stop_at = stop_at  # a function's qualified name: the path ends when it is entered ("": at the end)
        self.files: list[str] = []  # in the order first entered
        self.returns = 0
        self.returned_to: set[str] = set()  # the files the reading came back to at least once
        self.current: str | None = None
        self.stopped = False
        self.root = Call("", "")  # the llamabatch calls as a tree, for the followed count
        self._stack: list[tuple[object, Call]] = []  # (frame, its call), innermost last

    def _move(self, filename: str) -> None:
        if filename == self.current:
            return
        if filename in self.files:
            self.returns += 1
            self.returned_to.add(filename)
        else:
            self.files.append(filename)
        self.current = filename

    def __call__(self, frame, event, arg):
        if self.stopped or event not in ("call", "return"):
            return
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGE):
            self._move(code.co_filename)
            call = Call(code.co_filename, code.co_name, end=code.co_qualname == self.stop_at, code=code)
            (self._stack[-1][1] if self._stack else self.root).calls.append(call)
            self._stack.append((frame, call))
            if call.end:
                self.stopped = True
        elif event == "return":
            if self._stack and self._stack[-1][0] is frame:
                self._stack.pop()
            caller = frame.f_back
            if caller is not None and caller.f_code.co_filename.startswith(PACKAGE):
                self._move(caller.f_code.co_filename)

    def trace(self, run) -> "Tracer":
        sys.setprofile(self)
        try:
            run()
        finally:
            sys.setprofile(None)
        return self


class Call:
    """One call into llamabatch and the llamabatch calls made under it."""

    def __init__(self, filename: str, name: str, end: bool = False, code: object = None):
        self.filename, self.name, self.end, self.code = filename, name, end, code
        self.calls: list[Call] = []

    def under(self) -> list["Call"]:
        """The calls made under this one, not counting import-time module bodies."""
        return [c for c in self.calls if c.name != "<module>"]

    def followed(self) -> list["Call"]:
        """The calls under this one a reader follows: the path's end and those that call further."""
        return [c for c in self.under() if c.end or c.under()]


class Followed:
    """The followed count: Tracer's moves over the call tree without imports, leaf calls and
    functions read before."""

    def __init__(self, tracer: Tracer):
        self.files: list[str] = []
        self.returns = 0
        self.returned_to: set[str] = set()
        self.current: str | None = None
        self.read: set[object] = set()  # the functions read so far
        self._walk(tracer.root)

    _move = Tracer._move

    def _walk(self, call: Call) -> bool:
        """Read `call` and what it calls; True once the path's end is reached."""
        if call.filename:
            self._move(call.filename)
        if call.end:
            return True
        for under in call.followed():
            if under.code in self.read and not under.end:
                continue
            self.read.add(under.code)
            if self._walk(under):
                return True
            if call.filename:
                self._move(call.filename)
        return False


def open_engine_path(model: str) -> Tracer:
    from llamabatch import EngineConfig
    from llamabatch.engines import open_engine

    engines = []
    tracer = Tracer("LlamaRunner.__init__")
    tracer.trace(lambda: engines.append(open_engine(EngineConfig(model=model, n_parallel=2, n_ctx=1024, threads=2))))
    for engine in engines:
        engine.close()
    return tracer


def start_job_path(model: str) -> Tracer:
    from llamabatch.jobs import start_job

    folder = Path(tempfile.mkdtemp(prefix="call_paths"))
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": f"Say {i}.", "max_tokens": 2}) + "\n" for i in range(4)))
    jobs = []
    tracer = Tracer()
    tracer.trace(lambda: jobs.append(start_job(str(source), str(folder / "out.jsonl"), model=model, n_parallel=2,
                                               threads=2)))
    for job in jobs:
        job.cancel()
        job.wait()
    return tracer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print each path's files in the order first entered")
    args = ap.parse_args()
    from llamabatch.models.resolve import resolve_model_ref

    model = resolve_model_ref("smollm2").path
    for name, path in (("open_engine (settings -> runner)", open_engine_path),
                       ("start_job (input -> the job started)", start_job_path)):
        say(f"tracing {name}")
        tracer = path(model)
        for how, count in (("traced", tracer), ("followed", Followed(tracer))):
            print(f"{name}, {how}: {len(count.files)} files, {count.returns} returns to a file already left "
                  f"({len(count.returned_to)} files returned to)")
            if args.list:
                for f in count.files:
                    print("   ", Path(f).relative_to(Path(PACKAGE).parent))


if __name__ == "__main__":
    main()
