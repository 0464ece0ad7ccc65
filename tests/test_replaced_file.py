"""replacing() writes through a symbolic link: the new file is renamed onto the link's target and
the link stays a link, as JSONL output (written in place) always did; so `-o link.csv`,
`-o link.jsonl` and every other file llamabatch replaces follow one rule."""
from __future__ import annotations

import os
import sqlite3

import pytest

from cli_harness import invoke, runner_for
from llamabatch.files.replaced_file import replacing
from table_files import write_csv

FAST = ["--n-parallel", "2", "--max-tokens", "3", "-q"]


def linked(tmp_path, name, target_name, text=None):
    folder = tmp_path / "real"
    folder.mkdir(exist_ok=True)
    target = folder / target_name
    if text is not None:
        target.write_text(text)
    link = tmp_path / name
    link.symlink_to(os.path.relpath(target, tmp_path))
    return link, target


def test_replacing_a_link_replaces_its_target_and_keeps_the_link(tmp_path):
    link, target = linked(tmp_path, "link.txt", "target.txt", "old")
    with replacing(link) as tmp:
        assert os.path.dirname(tmp) == str(target.parent)  # beside the target: the rename is atomic
        with open(tmp, "w") as f:
            f.write("new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(os.listdir(target.parent)) == ["target.txt"]


def test_a_dangling_link_gets_its_target_made(tmp_path):
    link, target = linked(tmp_path, "link.txt", "target.txt")
    with replacing(link) as tmp:
        with open(tmp, "w") as f:
            f.write("new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_failed_write_leaves_link_and_target_as_they_were(tmp_path):
    link, target = linked(tmp_path, "link.txt", "target.txt", "old")
    with pytest.raises(RuntimeError):
        with replacing(link) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("disk full")
    assert link.is_symlink() and target.read_text() == "old"
    assert sorted(os.listdir(target.parent)) == ["target.txt"]


@pytest.mark.parametrize("name", ["out.csv", "out.parquet", "out.sqlite", "out.jsonl"])
def test_run_writes_every_output_kind_through_a_link(tmp_path, name):
    src = write_csv(tmp_path / "in.csv", "text\nx\ny\n")
    link, target = linked(tmp_path, name, name)
    r = invoke(["run", str(src), "--template", "{text}", "-o", str(link), *FAST], runner=runner_for())
    assert r.exit_code == 0, r.stderr
    assert link.is_symlink() and target.is_file() and target.stat().st_size > 0
    if name.endswith(".sqlite"):
        db = sqlite3.connect(target)
        assert db.execute("SELECT count(*) FROM results").fetchone() == (2,)
        db.close()
