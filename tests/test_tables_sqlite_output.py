"""`-o FILE.sqlite|.db` replaces only what llamabatch wrote: an existing database with other
tables, or a file that is no SQLite database, is refused in one line before anything runs
(and left as it was); a database holding only an earlier run's `results` is replaced."""
from __future__ import annotations

import sqlite3

import pytest

from cli_harness import invoke, runner_for
from table_files import write_csv

FAST = ["--n-parallel", "2", "--max-tokens", "3", "-q"]


def run(*args, **kw):
    return invoke(["run", *map(str, args)], runner=runner_for(), **kw)


@pytest.fixture
def rows(tmp_path):
    return write_csv(tmp_path / "in.csv", "text\nx\ny\n")


def test_a_database_with_other_tables_is_refused_and_kept(tmp_path, rows):
    app = tmp_path / "app.db"
    db = sqlite3.connect(app)
    db.execute("CREATE TABLE customers (name TEXT)")
    db.execute("INSERT INTO customers VALUES ('ada')")
    db.commit()
    db.close()
    before = app.read_bytes()
    r = run(rows, "--template", "{text}", "-o", app, *FAST)
    assert r.exit_code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "app.db" in lines[0] and "customers" in lines[0], r.stderr
    assert app.read_bytes() == before
    assert not (tmp_path / "app.db.records.jsonl").exists()


def test_a_file_that_is_not_a_database_is_refused_and_kept(tmp_path, rows):
    notes = tmp_path / "x.sqlite"
    notes.write_text("my notes\n")
    r = run(rows, "--template", "{text}", "-o", notes, *FAST)
    assert r.exit_code == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "not an SQLite database" in r.stderr, r.stderr
    assert notes.read_text() == "my notes\n"


def test_an_earlier_runs_results_and_an_empty_file_are_replaced(tmp_path, rows):
    out = tmp_path / "out.sqlite"
    out.write_bytes(b"")  # e.g. made by `touch`: nothing to lose
    for _ in range(2):
        r = run(rows, "--template", "{text}", "-o", out, *FAST)
        assert r.exit_code == 0, r.stderr
    r = run(rows, "--template", "{text}", "-o", out, "--resume", *FAST)
    assert r.exit_code == 0, r.stderr
    db = sqlite3.connect(out)
    assert db.execute("SELECT row, finish_reason FROM results ORDER BY row").fetchall() == [
        (1, "stop"), (2, "stop")]
    db.close()


def test_a_table_added_during_the_run_is_not_destroyed_when_the_table_is_written(tmp_path, rows, monkeypatch):
    from llamabatch.jobs.tables import table_output

    out = tmp_path / "out.db"
    real = table_output.WRITERS["sqlite"]

    def someone_adds_a_table(*args):
        db = sqlite3.connect(out)
        db.execute("CREATE TABLE notes (x)")
        db.commit()
        db.close()
        return real(*args)

    monkeypatch.setitem(table_output.WRITERS, "sqlite", someone_adds_a_table)
    r = run(rows, "--template", "{text}", "-o", out, *FAST)
    assert r.exit_code == 1 and "notes" in r.stderr and "--resume" in r.stderr, r.stderr
    db = sqlite3.connect(out)
    assert db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall() == [("notes",)]
    db.close()
