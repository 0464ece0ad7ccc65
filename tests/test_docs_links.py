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


@pytest.mark.parametrize("where,source,target", LINKS, ids=[f"{w} {t}" for w, _, t in LINKS])
def test_link_resolves(where, source, target):
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / file_part).resolve() if file_part else source
    assert dest.exists(), f"{where}: {target}: no such file"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{where}: {target}: no heading with that anchor in {dest.name}"
