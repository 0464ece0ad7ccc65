"""The columns of a results table: every table INPUT's rows numbered in `row` (embeddings
too), and kept input columns that would share a name with another column of the table
(`id` and `input.id`; `ID` in SQLite, which folds case) refused before anything runs."""
from __future__ import annotations

import csv
import json
import sqlite3

import pytest

from cli_harness import invoke, runner_for
from table_files import write_csv
from lazy_modules import lazy

pq = lazy("pyarrow.parquet")

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


@pytest.mark.parametrize("output", ["out.csv", "out.parquet", "out.sqlite"])
def test_kept_columns_that_would_share_a_name_are_refused_before_the_run(tmp_path, output):
    src = write_csv(tmp_path / "in.csv", "id,input.id,text\n1,a,x\n2,b,y\n")
    out = tmp_path / output
    r = run(src, "--template", "{text}", "--keep-columns", "all", "-o", out, *FAST)
    assert r.exit_code == 1, r.stderr  # as for a --keep-columns name that is no column
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'id'" in lines[0] and "'input.id'" in lines[0], r.stderr
    assert not out.exists() and not (tmp_path / (output + ".records.jsonl")).exists()


def test_sqlite_folds_case_so_ID_is_kept_as_input_ID_and_a_and_A_are_refused(tmp_path):
    src = write_csv(tmp_path / "in.csv", "ID,text\nk1,x\nk2,y\n")
    out = tmp_path / "out.sqlite"
    r = run(src, "--template", "{text}", "--id-column", "ID", "--keep-columns", "all", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    db = sqlite3.connect(out)
    assert db.execute('SELECT id, "input.ID", text FROM results ORDER BY row').fetchall() == [
        ("k1", "k1", "x"), ("k2", "k2", "y")]
    db.close()
    both = write_csv(tmp_path / "both.csv", "a,A,text\n1,2,x\n")
    r = run(both, "--template", "{text}", "--keep-columns", "all", "-o", tmp_path / "both.sqlite", *FAST)
    assert r.exit_code == 1 and "'a'" in r.stderr and "'A'" in r.stderr, r.stderr
    # CSV and Parquet tell a and A apart: kept as they are
    r = run(both, "--template", "{text}", "--keep-columns", "all", "-o", tmp_path / "both.parquet", *FAST)
    assert r.exit_code == 0, r.stderr
    assert pq.read_table(tmp_path / "both.parquet").column_names[2:4] == ["a", "A"]


def test_jsonl_output_keeps_clashing_names_as_they_are(tmp_path):
    # a JSONL record's "input" holds the input's own names: nothing clashes there
    src = write_csv(tmp_path / "in.csv", "id,input.id,text\n1,a,x\n")
    out = tmp_path / "out.jsonl"
    r = run(src, "--template", "{text}", "--keep-columns", "all", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    assert json.loads(out.read_text())["input"] == {"id": "1", "input.id": "a", "text": "x"}


def test_a_column_named_twice_in_keep_columns_is_kept_once(tmp_path):
    src = write_csv(tmp_path / "in.csv", "text,n\nx,1\n")
    out = tmp_path / "out.csv"
    r = run(src, "--template", "{text}", "--keep-columns", "n,text,n", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    with open(out, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    assert header[:4] == ["row", "id", "n", "text"] and header.count("n") == 1


def test_a_responses_records_cells_are_read_from_its_output_items():
    from llamabatch.jobs.tables.table_output import calls_text, finish_text, reasoning_text, response_text

    body = {"object": "response", "status": "completed", "output": [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Calling."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}",
         "status": "completed"}]}
    record = {"id": "r", "response": {"status_code": 200, "body": body}, "error": None}
    assert (response_text(record), reasoning_text(record)) == ("Calling.", "hm")
    assert json.loads(calls_text(record)) == [{"call_id": "call_1", "name": "f", "arguments": "{}"}]
    calls_only = {"id": "r", "response": {"body": {"object": "response", "output": body["output"][2:]}}}
    assert (response_text(calls_only), reasoning_text(calls_only)) == (None, None)
    assert finish_text(record) == "tool_calls" and finish_text({"response": {"body": {
        "object": "response", "status": "incomplete", "output": []}}}) == "length"


def test_an_openai_batch_lines_finish_reason_fills_its_cell(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}) + "\n")
    out = tmp_path / "out.csv"
    done = invoke(["run", str(src), "-o", str(out)], runner=runner_for(lambda prompt: "a long answer"))
    assert done.exit_code == 0, done.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert (row["id"], row["finish_reason"]) == ("c1", "length")
