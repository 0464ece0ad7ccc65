"""CSV and TSV outputs guard against spreadsheet formulas (OWASP's CSV injection advice): a text
cell beginning with =, +, -, @, a tab or a carriage return is written with a leading ', unless
--csv-formulas raw; numbers stay numbers, and Parquet and SQLite hold the text as it is."""
from __future__ import annotations

import csv
import sqlite3

import pytest

from cli_harness import invoke, runner_for
from llamabatch.jobs.tables.table_writers import formula_safe
from table_files import write_csv

FAST = ["--n-parallel", "2", "--max-tokens", "40", "-q"]
EVIL = '=HYPERLINK("http://evil.example")'


def run(*args, reply=None, **kw):
    return invoke(["run", *map(str, args)], runner=runner_for(reply), **kw)


def rows_of(path, delimiter=","):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f, delimiter=delimiter))


@pytest.mark.parametrize("cell, written", [
    (EVIL, "'" + EVIL), ("+1+cmd", "'+1+cmd"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\t=1", "'\t=1"), ("\r=1", "'\r=1"), ("-", "'-"),
    ("-5", "-5"), ("+3.25", "+3.25"), ("-1e5", "-1e5"), ("plain", "plain"), ("", ""), ("a=b", "a=b"),
])
def test_formula_safe(cell, written):
    assert formula_safe(cell) == written


@pytest.mark.parametrize("output, delimiter", [("out.csv", ","), ("out.tsv", "\t")])
def test_answers_and_kept_cells_that_start_a_formula_are_escaped_by_default(tmp_path, output, delimiter):
    src = write_csv(tmp_path / "in.csv", f'q,note\n"{EVIL.replace(chr(34), chr(34) * 2)}",-5\n@x,+cmd\n')
    out = tmp_path / output
    r = run(src, "--template", "{q}", "--keep-columns", "note", "-o", out, *FAST, reply=lambda prompt: prompt)
    assert r.exit_code == 0, r.stderr
    rows = rows_of(out, delimiter)
    assert rows[0][:5] == ["row", "id", "note", "response", "finish_reason"]
    assert [(x[2], x[3]) for x in rows[1:]] == [("-5", "'" + EVIL), ("'+cmd", "'@x")]


def test_raw_writes_cells_as_they_are(tmp_path):
    src = write_csv(tmp_path / "in.csv", "q\n@x\n")
    out = tmp_path / "out.csv"
    r = run(src, "--template", "={q}", "--csv-formulas", "raw", "-o", out, *FAST, reply=lambda prompt: prompt)
    assert r.exit_code == 0, r.stderr
    assert rows_of(out)[1][2] == "=@x"


def test_parquet_and_sqlite_hold_the_text_as_it_is(tmp_path):
    src = write_csv(tmp_path / "in.csv", "q\nx\n")
    out = tmp_path / "out.sqlite"
    r = run(src, "--template", "={q}", "-o", out, *FAST, reply=lambda prompt: prompt)
    assert r.exit_code == 0, r.stderr
    db = sqlite3.connect(out)
    assert db.execute("SELECT response FROM results").fetchall() == [("=x",)]
    db.close()


def test_csv_formulas_takes_escape_or_raw(tmp_path):
    src = write_csv(tmp_path / "in.csv", "q\nx\n")
    r = run(src, "--template", "{q}", "--csv-formulas", "strip", "-o", tmp_path / "out.csv", *FAST)
    assert r.exit_code == 2 and "strip" in r.stderr, r.stderr
