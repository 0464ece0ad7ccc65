"""A stray or unterminated quote in a CSV input is its own row's error, and the lines it would
have swallowed are read as rows of their own: rows are never merged silently. Quoted fields
that span lines legitimately still read as one cell."""
from __future__ import annotations

import pytest

from llamabatch.tables import TableError, open_table, read_rows

from cli_harness import invoke, runner_for
from table_files import write_csv


def rows_of(path, template="{text}", **kw):
    return list(read_rows(str(path), template, **kw))


def count(path):
    table = open_table(str(path))
    try:
        return table.count()
    finally:
        table.close()


def test_an_unterminated_quote_is_its_rows_error_and_the_rest_are_rows(tmp_path):
    lines = [f"{i},text {i}" for i in range(1, 1001)]
    lines[997] = '998,"oops'  # a quote opened and never closed: it would swallow lines 999-1001
    path = write_csv(tmp_path / "r.csv", "n,text\n" + "\n".join(lines) + "\n")
    rows = rows_of(path, "{text}")
    assert len(rows) == 1000 and count(path) == 1000
    bad = rows[997]
    assert bad.row == 998 and bad.error[0] == "invalid_row"
    assert "line 999" in bad.error[1] and "quote" in bad.error[1], bad.error
    assert [r.prompt for r in rows[998:]] == ["text 999", "text 1000"]
    assert sum(r.ok for r in rows) == 999


def test_a_stray_quote_closed_by_a_later_one_does_not_merge_rows(tmp_path):
    # line 3's stray quote would run on to the opening quote of line 5's cell
    path = write_csv(tmp_path / "r.csv", 'text,n\na,1\n"b,2\nc,3\n"d",4\ne,5\n')
    rows = rows_of(path)
    assert [r.row for r in rows] == [1, 2, 3, 4, 5] and count(path) == 5
    assert rows[1].error[0] == "invalid_row" and "line 3" in rows[1].error[1]
    assert [r.prompt for r in rows if r.ok] == ["a", "c", "d", "e"]


def test_quoted_fields_over_several_lines_are_still_one_cell(tmp_path):
    path = write_csv(tmp_path / "r.csv", 'text,n\n"one\ntwo, three\n""four""",1\r\n"x\r\ny",2\nlast,3\n')
    rows = rows_of(path)
    assert [(r.row, r.prompt) for r in rows] == [(1, 'one\ntwo, three\n"four"'), (2, "x\r\ny"), (3, "last")]
    assert count(path) == 3


def test_an_unterminated_quote_in_the_header_is_one_line(tmp_path):
    path = write_csv(tmp_path / "r.csv", 'text,"n\na,1\n')
    with pytest.raises(TableError, match=r"header row of .*r\.csv.*quote"):
        rows_of(path)


def test_run_gives_the_row_its_error_and_runs_the_rest(tmp_path):
    path = write_csv(tmp_path / "r.csv", 'text,n\na,1\nb,"2\nc,3\n')
    out = tmp_path / "out.csv"
    r = invoke(["run", str(path), "--template", "{text}", "-o", str(out), "--n-parallel", "2", "--max-tokens", "3",
                "-q"], runner=runner_for())
    assert r.exit_code == 0, r.stderr
    table = out.read_text().splitlines()
    assert len(table) == 4 and table[2].startswith("2,2,,error,invalid_row,")
    assert table[3].startswith("3,3,") and "error" not in table[3]
