"""The columns of a results table: every table INPUT's rows numbered in `row` (embeddings
too)."""
from __future__ import annotations

import csv
import json

import pytest

from cli_harness import invoke, runner_for
from table_files import write_csv

FAST = ["--n-parallel", "2", "--max-tokens", "3", "-q"]


def run(*args, **kw):
    return invoke(["run", *map(str, args)], runner=runner_for(), **kw)


def csv_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("how", [["--embed-column", "body"], ["--embed", "--template", "Doc: {body}"]])
def test_embedding_tables_number_their_rows(tmp_path, how):
    src = write_csv(tmp_path / "docs.csv", "doc_id,body\nd1,hello\nd2,\nd3,xyz\n")
    out = tmp_path / "vectors.csv"
    r = run(src, *how, "--id-column", "doc_id", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    rows = csv_rows(out)
    assert [(x["row"], x["id"]) for x in rows] == [("1", "d1"), ("2", "d2"), ("3", "d3")]
    assert len(json.loads(rows[0]["response"])) > 0
    assert rows[1]["error_code"] == ("invalid_request" if how[0] == "--embed-column" else "")
    # the records file's embedding records carry the row number too (what --order input sorts by)
    records = [json.loads(x) for x in (tmp_path / "vectors.csv.records.jsonl").read_text().splitlines()]
    assert [x["row"] for x in records] == [1, 2, 3]


def test_embedding_jsonl_records_from_a_table_carry_row(tmp_path):
    src = write_csv(tmp_path / "docs.csv", "body\nhello\nxyz\n")
    out = tmp_path / "vectors.jsonl"
    r = run(src, "--embed-column", "body", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["id"], x["row"]) for x in records] == [(1, 1), (2, 2)]

