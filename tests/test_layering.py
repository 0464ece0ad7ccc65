"""The layers of llamabatch, as rules read from the source with `ast` (as test_import_graph.py
reads the import graph: lazy imports count, `if TYPE_CHECKING:` ones do not).

From the bottom up (../shared/design.md):

    value types   the modules at the root (config, params, results, errors, api, version), with
                  files/, checks/, openai_format/ and constraints/ beside them
    core          scheduler, plan, sequences, the tick loop
    models        model files: where they are, their GGUF headers, their chat templates
    kernel_paths  which CPU kernel path llama.cpp takes, worked out without calling it
    llama         LlamaRunner and the llama.cpp boundary
    prefix_store, tables
    settings      flags > env > file > defaults, resolved once
    in_process    the Engine of this process, and what a child or worker needs to build one
    supervised, cluster             an engine in a child process; engines on Ray workers
    engines       the factory that chooses among the three
    jobs          run_job and what a batch job keeps on disk
    chat, bench, serve              the libraries behind those commands
    cli           Typer: argv in, exit status out

A module imports from its own layer or below. Only cli/ imports typer or ends the process;
only engines/ builds an engine (in_process/ builds the Engine a child or worker runs);
benchmarks use the library, never the CLI's modules (and
inside llamabatch/ nothing but cli/ and __main__ imports the CLI: test_import_graph.py).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from test_import_graph import (ROOT, _type_checking_nodes, all_modules, external_imports, find_cycle, import_graph,
                               imports_of, parsed)

BENCHMARKS = ROOT.parent / "benchmarks"
LAYERS: dict[str, int] = {
    "files": 0, "checks": 0, "processes": 0, "openai_format": 0, "constraints": 0, "core": 1, "models": 1, "kernel_paths": 1, "llama": 2,
    "prefix_store": 3, "tables": 3, "settings": 4, "in_process": 5, "supervised": 6, "cluster": 6, "engines": 7,
    "jobs": 8, "chat": 9, "bench": 9, "serve": 9, "cli": 10,
}
VALUE_TYPES = 0  # a module directly under llamabatch/
PUBLIC_SURFACE = ("llamabatch", "llamabatch.__main__")  # the package root and the console entry: above every layer
ENGINE_CLASSES = ("Engine", "EngineCore", "SupervisedEngine", "RayPool")


def layer_of(module: str) -> int:
    """The layer of a module of llamabatch; an unknown subpackage is a failure, not a guess."""
    parts = module.split(".")
    if len(parts) == 2 and not (ROOT / parts[1]).is_dir():
        return VALUE_TYPES
    assert parts[1] in LAYERS, f"{module}: llamabatch/{parts[1]}/ has no layer; add it to LAYERS"
    return LAYERS[parts[1]]


def package_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def upward_imports() -> list[str]:
    found = []
    for name, deps in sorted(import_graph().items()):
        if name in PUBLIC_SURFACE:
            continue
        for dep in sorted(deps):
            if dep not in PUBLIC_SURFACE and layer_of(dep) > layer_of(name):
                found.append(f"{name} (layer {layer_of(name)}) imports {dep} (layer {layer_of(dep)})")
    return found


def test_layer_of_knows_every_package_and_the_value_types():
    assert layer_of("llamabatch.config") == VALUE_TYPES and layer_of("llamabatch.errors") == VALUE_TYPES
    assert layer_of("llamabatch.core.engine") < layer_of("llamabatch.settings.layers") < layer_of("llamabatch.cli.app")
    for name in all_modules():
        if name not in PUBLIC_SURFACE:
            layer_of(name)


def test_imports_point_down_the_layers():
    found = upward_imports()
    assert not found, "imports that climb a layer:\n" + "\n".join(found)


def package_graph(types_too: bool = True) -> dict[str, set[str]]:
    """Which package of llamabatch imports which other (the modules at the root left out), the
    imports under `if TYPE_CHECKING:` included: they are not run, but a reader follows them."""
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name.count(".") < 1 or not (ROOT / package_of(name)).is_dir():
            continue
        deps = {package_of(d) for d in imports_of(name, path, modules, types_too) if (ROOT / package_of(d)).is_dir()}
        graph.setdefault(package_of(name), set()).update(deps - {package_of(name)})
    return graph


def test_no_loop_between_packages_not_even_through_an_import_for_types():
    # core/plan.py once imported models' ChatFormats for its types while models read GGUF
    # headers from llama/, which imports core: a loop that only types closed
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}})
    graph = package_graph()
    assert "core" in graph and "models" in graph
    cycle = find_cycle({p: graph.get(p, set()) for p in set(graph) | set().union(*graph.values())})
    assert cycle is None, " -> ".join(cycle)


def test_core_imports_nothing_from_the_layers_that_build_or_run_engines():
    banned = ("settings", "engines", "jobs", "cli", "supervised", "cluster")
    for name, deps in import_graph().items():
        if package_of(name) == "core":
            reached = sorted(d for d in deps if package_of(d) in banned)
            assert not reached, (name, reached)


def test_value_types_import_no_engine_layer():
    for name, deps in import_graph().items():
        if name not in PUBLIC_SURFACE and layer_of(name) == VALUE_TYPES:
            reached = sorted(d for d in deps if layer_of(d) != VALUE_TYPES)
            assert not reached, (name, reached)


# -- ending the process, typer ------------------------------------------------------------------

def _ends_the_process(node: ast.AST) -> bool:
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return isinstance(exc, ast.Name) and exc.id == "SystemExit"
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return (func.value.id, func.attr) in (("sys", "exit"), ("os", "_exit"))
        return isinstance(func, ast.Name) and func.id in ("exit", "quit")
    return False


def process_enders(path: Path) -> list[int]:
    """Lines of `path` that end the process: sys.exit, os._exit, exit(), raise SystemExit."""
    return [node.lineno for node in ast.walk(parsed(path)) if _ends_the_process(node)]


def test_the_process_enders_scan_finds_each_kind():
    samples = ["import sys\nsys.exit(1)\n", "import os\nos._exit(0)\n", "raise SystemExit(2)\n",
               "raise SystemExit\n", "exit(3)\n"]
    for text in samples:
        assert any(_ends_the_process(n) for n in ast.walk(ast.parse(text))), text
    assert not any(_ends_the_process(n) for n in ast.walk(ast.parse("raise ValueError()\nx.exit()\n")))


def test_only_the_cli_ends_the_process():
    found = [f"{name}:{line}" for name, path in sorted(all_modules().items())
             if package_of(name) != "cli" and name != "llamabatch.__main__" for line in process_enders(path)]
    assert not found, "outside llamabatch/cli/: " + ", ".join(found)


def test_only_the_cli_imports_typer():
    importers = sorted(name for name, path in all_modules().items() if "typer" in external_imports(path))
    assert importers, "the scan found no importer of typer at all"
    assert all(package_of(name) == "cli" for name in importers), importers


# -- building engines ---------------------------------------------------------------------------

def engine_constructions(path: Path) -> list[str]:
    """`Engine(...)`, `SupervisedEngine(...)`, `RayPool(...)` and `RayPool.start(...)` calls
    in `path`, spelled `X(...)` or `module.X(...)`."""
    tree = parsed(path)
    skip = _type_checking_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "start" and isinstance(func.value, (ast.Name, ast.Attribute)):
            func = func.value  # RayPool.start(...)
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in ENGINE_CLASSES:
            found.append(f"{name}(...) at line {node.lineno}")
    return found


def test_the_construction_scan_sees_each_spelling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("Engine(c)\ncore.Engine(c, runner=r)\nSupervisedEngine(c)\nRayPool.start(c)\n"
                      "pool.RayPool(x)\nEngineConfig(x)\nengine.start()\n", encoding="utf-8")
    assert [f.split("(")[0] for f in engine_constructions(sample)] == [
        "Engine", "Engine", "SupervisedEngine", "RayPool", "RayPool"]


def test_only_engines_builds_engines():
    # in_process/ may build the Engine of this process (a supervised child's, a Ray worker's);
    # SupervisedEngine and RayPool are built by the factory alone.
    found = [f"{name}: {call}" for name, path in sorted(all_modules().items())
             for call in engine_constructions(path)
             if package_of(name) != "engines" and not (package_of(name) == "in_process" and call.startswith("Engine("))]
    assert not found, "engines built outside llamabatch/engines/:\n" + "\n".join(found)


# -- test runners in other processes ------------------------------------------------------------

FILE_EXECUTION = ("spec_from_file_location", "exec_module", "run_path", "exec", "execfile")


def file_executions(source: str | ast.AST) -> list[str]:
    """Calls in `source` that run code from a file or a string: importlib's
    spec_from_file_location and exec_module, runpy.run_path, exec."""
    found = []
    for node in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in FILE_EXECUTION:
                found.append(f"{name}(...) at line {node.lineno}")
    return found


def test_no_module_runs_code_from_a_file_path():
    # The supervised child and Ray workers get a test's runner as a registered name and an
    # importable module (in_process/runners.py), never as a file to execute.
    sample = "importlib.util.spec_from_file_location('m', p)\nrunpy.run_path(p)\nexec(text)\nimportlib.import_module(m)\n"
    assert len(file_executions(sample)) == 3
    found = [f"{name}: {call}" for name, path in sorted(all_modules().items())
             for call in file_executions(parsed(path))]
    assert not found, found


# -- who may import the CLI (inside llamabatch/: test_import_graph.py) ---------------------------

def _imported_modules(path: Path) -> set[str]:
    tree = parsed(path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_benchmarks_use_the_library_never_the_cli():
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert scripts, "no benchmark scripts found"
    found = {path.name: sorted(m for m in _imported_modules(path) if m == "llamabatch.cli"
                                or m.startswith("llamabatch.cli."))
             for path in scripts}
    found = {name: mods for name, mods in found.items() if mods}
    assert not found, found


# -- the package root and the OpenAI request format ---------------------------------------------

ROOT_MODULES = {"__init__", "__main__", "api", "config", "errors", "params", "results", "version"}


def test_the_root_holds_the_public_value_types_and_packages_only():
    loose = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ROOT_MODULES)
    assert not loose, f"modules at llamabatch/'s root that belong in a package: {loose}"


def test_outside_openai_format_only_its_public_names_are_imported():
    found = [f"{name} imports {dep}" for name, deps in sorted(import_graph().items())
             if package_of(name) != "openai_format"
             for dep in sorted(deps) if dep.startswith("llamabatch.openai_format.")]
    assert not found, "import these from llamabatch.openai_format itself:\n" + "\n".join(found)


# -- processes llamabatch starts of itself ------------------------------------------------------

CLI_MODULE = re.compile(r"llamabatch\.cli(\.\w+)*")


def cli_module_strings(path: Path) -> list[str]:
    """String constants in `path` that name a module of the CLI (a `python -m llamabatch.cli.x`
    command is an import of the CLI that the import graph cannot see)."""
    tree = parsed(path)
    return [f"{node.value!r} at line {node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CLI_MODULE.fullmatch(node.value)]


def test_no_module_below_the_cli_starts_a_cli_module_by_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('cmd = [sys.executable, "-m", "llamabatch.cli.engine_child"]\n', encoding="utf-8")
    assert len(cli_module_strings(sample)) == 1
    found = [f"{name}: {hit}" for name, path in sorted(all_modules().items())
             if package_of(name) != "cli" and name not in PUBLIC_SURFACE for hit in cli_module_strings(path)]
    assert not found, "start it as a registered process (processes/entries.py):\n" + "\n".join(found)


def test_every_registered_process_has_an_entry_in_the_cli():
    from llamabatch.cli.process_entries import ENTRIES
    from llamabatch.processes.entries import NAMES

    assert sorted(ENTRIES) == sorted(NAMES)


# -- for the next reader ------------------------------------------------------------------------

MAX_BODY_LINES = 80
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
# Another project's issue is a fact a reader can look up; it is named with its project, as
# `owner/repo` or one of the projects llamabatch stands on (llama-cpp-python, then the number).
OUTSIDE_PROJECT = r"(?:[\w.-]+/[\w.-]+|llama\.cpp|llama-cpp-python|ggml|vllm|ray|llguidance|huggingface_hub)"
OUTSIDE_ISSUE = re.compile(OUTSIDE_PROJECT + r"(?:'s)? issues? #?\d+", re.IGNORECASE)
TEXT_SUFFIXES = (".py", ".md", ".toml", ".txt", ".sh", ".bash", ".fish", ".jsonl", ".csv")


def long_functions(path: Path, limit: int = MAX_BODY_LINES) -> list[str]:
    """Functions in `path` whose body (from its first statement to its last line, the
    docstring included) is longer than `limit` lines."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.body[0].lineno + 1
            if lines > limit:
                found.append(f"{node.name} ({lines} lines) at line {node.lineno}")
    return found


def test_the_function_size_scan_counts_the_body(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def short():\n" + "    x = 1\n" * 80 + "\n\ndef long():\n" + "    x = 1\n" * 81,
                      encoding="utf-8")
    assert [f.split(" ")[0] for f in long_functions(sample)] == ["long"]


def test_no_function_body_is_over_80_lines():
    found = [f"{name}: {hit}" for name, path in sorted(all_modules().items()) for hit in long_functions(path)]
    assert not found, "split these:\n" + "\n".join(found)


def names_an_issue_of_ours(line: str) -> bool:
    return bool(ISSUE_NUMBER.search(OUTSIDE_ISSUE.sub("", line)))


def test_comments_give_the_reason_not_an_issue_number():
    found = [f"{name}:{i}" for name, path in sorted(all_modules().items())
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if names_an_issue_of_ours(line)]
    assert not found, "say why, not which issue: " + ", ".join(found)


def text_files_beside_the_package() -> list[Path]:
    """The tests, benchmarks, docs, examples and top-level files: everything but llamabatch/."""
    top = ROOT.parent
    files = [p for p in top.iterdir() if p.is_file() and p.suffix in TEXT_SUFFIXES]
    for folder in ("tests", "benchmarks", "docs", "examples", "completions"):
        files += [p for p in (top / folder).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                  and "__pycache__" not in p.parts]
    return sorted(files)


def test_an_issue_of_ours_is_named_by_what_it_guards_in_tests_benchmarks_and_docs():
    top = ROOT.parent
    found = [f"{path.relative_to(top)}:{i}" for path in text_files_beside_the_package()
             for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if names_an_issue_of_ours(line)]
    assert not found, "say what it guards, not which issue: " + ", ".join(found)


def test_the_issue_scan_tells_ours_from_another_projects():
    ours = "the fix for " + "issue" + " 63"
    assert names_an_issue_of_ours(ours) and names_an_issue_of_ours("see " + "Issues #" + "12")
    issue = "issue"  # spelled apart so that a plain grep of the tree for issue numbers stays empty
    assert not names_an_issue_of_ours(f"llama-cpp-python {issue} #771 makes the first call slow")
    assert not names_an_issue_of_ours(f"ggml-org/llama.cpp's {issue} 9876, and abetlen/llama-cpp-python {issue} 1")
    assert not names_an_issue_of_ours("the issue's 20,000 levels")


def test_the_contributing_guides_map_of_the_code_names_every_package_and_only_those():
    readme = (ROOT.parent / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = readme.split("## How the code is laid out", 1)[1].split("\n## ", 1)[0]
    tree = section.split("```", 2)[1]
    named = set(re.findall(r"(?<![\w/])([a-z_]+)/", tree)) - {"llamabatch", "reading", "writing", "resume", "estimates"}
    named_rooms = set(re.findall(r"jobs/[^\n]*", tree)[0].split("rooms:")[1].replace(",", " ").replace("/", " ").split())
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    rooms = {p.name for p in (ROOT / "jobs").iterdir() if (p / "__init__.py").exists()}
    assert named == packages, (sorted(named - packages), sorted(packages - named))
    assert named_rooms == rooms, (sorted(named_rooms), sorted(rooms))
    assert set(LAYERS) == packages  # and each package has its layer
    root_files = set(re.findall(r"(\w+)\.py", tree.split("the public value types")[0]))
    assert root_files == ROOT_MODULES - {"__main__"}, sorted(root_files)


# -- where the shared CLI layer and settings sit ---------------------------------------------

COMMAND_FOLDERS = ("run", "serve", "chat", "bench", "config", "models")


def test_the_shared_cli_layer_imports_no_command_folder_and_settings_no_cli():
    graph = import_graph()
    shared = [name for name in graph if name.startswith("llamabatch.cli.") and name.count(".") == 2
              and name.split(".")[2] not in COMMAND_FOLDERS and name != "llamabatch.cli.app"]  # app registers them
    assert "llamabatch.cli.engine_options" in shared and "llamabatch.cli.exit_status" in shared
    assert "llamabatch.cli.engine_setup" in shared
    for name in shared:
        folders = {d.split(".")[2] for d in graph[name] if d.startswith("llamabatch.cli.") and d.count(".") >= 3}
        assert not folders & set(COMMAND_FOLDERS), (name, folders)
    for name, deps in graph.items():
        if name.startswith("llamabatch.settings"):
            assert not any(d.startswith("llamabatch.cli") for d in deps), (name, deps)


def test_no_module_reads_the_runner_by_getattr_with_a_default():
    # what anyone may ask of a runner is declared in plan.Runner (what plans may ask, in its
    # RunnerCapabilities), so a runner missing one fails loudly instead of being guessed at
    found = [f"{name}:{i}" for name, path in sorted(all_modules().items())
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"getattr\((\w+\.)?_?runner\b", line)]
    assert not found, "declare it in plan.Runner and read it as an attribute: " + ", ".join(found)


# -- sizes: a module, a class and a folder a reader can hold at once ---------------------------------
#
# Each bound has a named set of what is still over it, each entry with the work that brings it
# under. The set only shrinks: an entry that is no longer over the bound fails its test until it
# is taken out, so the set cannot hide a new offender behind an old one.

MAX_MODULE_LINES = 500
MAX_CLASS_METHODS = 25  # every def in the class body: properties and setters count
MAX_FOLDER_MODULES = 20  # the .py files directly in a folder, its __init__.py not counted

STILL_OVER_MODULE_LINES: set[str] = set()  # every module is within the bound
STILL_OVER_CLASS_METHODS: set[str] = set()  # every class is within the bound
STILL_OVER_FOLDER_MODULES: set[str] = set()  # every folder is within the bound


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def class_method_counts(module: str, path: Path) -> dict[str, int]:
    """Each class of `path` (nested ones too), named module.Class, with the defs in its body."""
    return {f"{module}.{node.name}": sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
            for node in ast.walk(parsed(path)) if isinstance(node, ast.ClassDef)}


def folder_module_counts(root: Path = ROOT) -> dict[str, int]:
    """Each folder of the package (as llamabatch/x/y) with the modules directly in it."""
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        folder = path.parent.relative_to(root.parent).as_posix()
        counts[folder] = counts.get(folder, 0) + (path.name != "__init__.py")
    return counts


def over_module_lines() -> set[str]:
    return {name for name, path in all_modules().items() if module_lines(path) > MAX_MODULE_LINES}


def over_class_methods() -> set[str]:
    return {name for module, path in all_modules().items()
            for name, n in class_method_counts(module, path).items() if n > MAX_CLASS_METHODS}


def over_folder_modules() -> set[str]:
    return {folder for folder, n in folder_module_counts().items() if n > MAX_FOLDER_MODULES}


def test_the_size_scans_count_lines_defs_and_modules(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("class A:\n    @property\n    def p(self): pass\n    def f(self): pass\n"
                      "    async def g(self): pass\n    class B:\n        def h(self): pass\n    x = 1\n",
                      encoding="utf-8")
    assert module_lines(sample) == 8
    assert class_method_counts("m", sample) == {"m.A": 3, "m.B": 1}
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (package / name).write_text("", encoding="utf-8")
    assert folder_module_counts(package) == {"pkg": 2, "pkg/sub": 1}


def test_no_module_is_over_500_lines():
    new = sorted(over_module_lines() - STILL_OVER_MODULE_LINES)
    assert not new, f"split these (over {MAX_MODULE_LINES} lines): {new}"


def test_no_class_has_over_25_methods():
    new = sorted(over_class_methods() - STILL_OVER_CLASS_METHODS)
    assert not new, f"split these (over {MAX_CLASS_METHODS} methods, properties counted): {new}"


def test_no_folder_holds_over_20_modules():
    new = sorted(over_folder_modules() - STILL_OVER_FOLDER_MODULES)
    assert not new, f"split these (over {MAX_FOLDER_MODULES} modules): {new}"


def test_what_is_named_as_still_over_a_bound_is_still_over_it():
    # once the work lands, take its entry out of the set: the set only shrinks
    assert not STILL_OVER_MODULE_LINES - over_module_lines(), sorted(STILL_OVER_MODULE_LINES - over_module_lines())
    assert not STILL_OVER_CLASS_METHODS - over_class_methods(), sorted(STILL_OVER_CLASS_METHODS - over_class_methods())
    assert not STILL_OVER_FOLDER_MODULES - over_folder_modules(), sorted(STILL_OVER_FOLDER_MODULES - over_folder_modules())
