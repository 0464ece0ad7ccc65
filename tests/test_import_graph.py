"""No import cycles in llamabatch/, and the package root is the engine alone.

The graph is built from the source with `ast`: every `import`/`from ... import` anywhere
in a module, including the ones inside functions (a lazy import only hides a cycle until
someone calls the function), except those under `if TYPE_CHECKING:` (never executed).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import llamabatch

ROOT = Path(llamabatch.__file__).parent
PACKAGE = "llamabatch"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def _modules() -> tuple[tuple[str, Path], ...]:
    return tuple((module_name(p), p) for p in sorted(ROOT.rglob("*.py")))


def all_modules() -> dict[str, Path]:
    return dict(_modules())


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once and kept until forget_parsed() (the layering rules
    walk every module several times)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def forget_parsed() -> None:
    """Let the syntax trees go (conftest.py, after the last test that walks them)."""
    parsed.cache_clear()
    import_graph.cache_clear()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
                (isinstance(n, ast.Name) and n.id == "TYPE_CHECKING") or (isinstance(n, ast.Attribute) and n.attr == "TYPE_CHECKING")
                for n in ast.walk(node.test)):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(name: str, path: Path, modules: dict[str, Path], types_too: bool = False) -> set[str]:
    """The modules of llamabatch that `name` imports; `types_too`: its `if TYPE_CHECKING:` ones too."""
    tree = parsed(path)
    skip = set() if types_too else _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import mod` imports the submodule pkg.mod when there is one
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_lazy_imports_and_ignores_type_checking_ones():
    graph = import_graph()
    assert "llamabatch.llama.runner" in graph["llamabatch.in_process.runners"]  # imported inside load_model
    assert "llamabatch.core.engine" not in graph["llamabatch.core.handle"]  # only under TYPE_CHECKING
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles_in_llamabatch():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_outside_cli_imports_the_cli():
    graph = import_graph()
    for name, deps in graph.items():
        if not name.startswith("llamabatch.cli") and name != "llamabatch.__main__":  # __main__ runs the CLI
            assert not any(d.startswith("llamabatch.cli") for d in deps), (name, deps)


def external_imports(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, lazy imports included."""
    tree = parsed(path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_llama_folder_imports_llama_cpp():
    # the llama.cpp boundary is a folder (runner, load, vocab, samplers, kv, ...), not one file
    importers = {name for name, path in all_modules().items() if "llama_cpp" in external_imports(path)}
    assert importers, "the scan found no importer of llama_cpp at all"
    assert all(name.startswith("llamabatch.llama.") for name in importers), sorted(importers)
    assert "llamabatch.llama.runner" in importers
