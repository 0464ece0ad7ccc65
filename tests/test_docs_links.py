"""Every relative link in README.md and docs/*.md leads somewhere: the file exists, and a
`#anchor` names a heading of that file (GitHub's heading slugs). The README is a guide that
points into docs/; a page renamed or a heading reworded would otherwise leave dead links.
Links to other sites are not fetched."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for _, line in prose_lines(path.read_text(encoding="utf-8"))
            if re.match(r"#{1,6} ", line)}


def links() -> list[tuple[str, Path, str]]:
    found = []
    for path in DOCS:
        for number, line in prose_lines(path.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                found.append((f"{path.relative_to(ROOT)}:{number}", path, target))
    return found


LINKS = links()


def test_slugs_follow_github():
    assert slug(" CPU kernels: `--cpu-buffers`") == "cpu-kernels---cpu-buffers"
    assert slug(" Resources checked before they are taken — `--max-memory` / `max_memory`") == \
        "resources-checked-before-they-are-taken----max-memory--max_memory"
    assert slug(" A slow grammar does not set everyone's pace") == "a-slow-grammar-does-not-set-everyones-pace"
    assert len(LINKS) >= 20


def test_every_link_resolves():
    failures = []
    for where, source, target in LINKS:
        file_part, _, anchor = target.partition("#")
        dest = (source.parent / file_part).resolve() if file_part else source
        if not dest.exists():
            failures.append(f"{where}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            failures.append(f"{where}: {target}: no heading with that anchor in {dest.name}")
    assert not failures, "\n".join(failures)


# Paths and modules the docs name: `llamabatch/core/poison.py`, `benchmarks/soak.py`,
# `python -m llamabatch.cli.app`. Files move (the package was split into subpackages);
# a doc that names the old place would send a reader nowhere.
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:llamabatch|benchmarks|tests|examples|completions)/[\w./*-]*[\w*])")
MODULE = re.compile(r"(?<![\w/.~$-])(llamabatch(?:\.[a-z_][a-z0-9_]*)+)(?:\.[A-Z]\w*)?")


def named(pattern: re.Pattern) -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in pattern.findall(line):
                found.append((f"{path.relative_to(ROOT)}:{number}", name))
    return found


PATHS = [(w, p) for w, p in named(REPO_PATH) if not re.search(r"[A-Z]{3,}", p)]  # benchmarks/NAME.py is a pattern
MODULES = [(w, m) for w, m in named(MODULE) if not m.endswith((".toml", ".bash", ".fish"))]


def test_every_named_path_exists():
    missing = [f"{where}: {name}: no such file in the repository" for where, name in PATHS if not list(ROOT.glob(name))]
    assert not missing, "\n".join(missing)


def test_every_named_module_exists():
    import importlib
    import importlib.util

    failures = []
    for where, name in MODULES:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
            module = ".".join(parts[:cut])
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                continue
            try:
                obj = importlib.import_module(module)
            except ImportError:  # it exists, but needs an extra that is not installed here (ray)
                break
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    failures.append(f"{where}: {name}: {module} has no {attr}")
                    break
                obj = getattr(obj, attr)
            break
        else:
            failures.append(f"{where}: {name}: no such module")
    assert not failures, "\n".join(failures)


def test_paths_and_modules_are_found():
    assert len(PATHS) >= 20 and len(MODULES) >= 4


def test_every_flag_is_documented():
    # The reference promises every flag: a new option needs a line in docs/reference.md (or
    # the page its feature lives on) before this passes.
    import typer

    from llamabatch.cli.app import app

    text = "".join(path.read_text(encoding="utf-8") for path in DOCS)
    missing = []

    def walk(command, path):
        for param in command.params:
            for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
                if opt.startswith("--") and not re.search(re.escape(opt) + r"(?![\w-])", text):
                    missing.append(f"{' '.join(path)} {opt}")
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), ["llamabatch"])
    assert not missing, "flags no page of README.md or docs/ mentions: " + ", ".join(missing)
