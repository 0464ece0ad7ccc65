"""`llamabatch run` with tables in and out, on the scripted fake runner (no model): every input
kind, every output format, --keep-columns/--id-column/templates, resume from a records file a
kill left (torn last line, rows out of order), and the refusals said before anything loads."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import sqlite3
import sys
import time

import pytest

from cli_harness import invoke, runner_for
from llamabatch.cli.run.job_view import Interrupts
from llamabatch.jobs.tables import table_input
from table_files import fake_hub, write_csv, write_feather, write_parquet
from lazy_modules import lazy

pa = lazy("pyarrow")
pq = lazy("pyarrow.parquet")

FAST = ["--n-parallel", "2", "--max-tokens", "3", "-q"]


def run(*args, reply=None, **kw):
    return invoke(["run", *map(str, args)], runner=runner_for(reply), **kw)


def csv_rows(path, delimiter=","):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter=delimiter))


@pytest.fixture
def reviews(tmp_path):
    return write_csv(tmp_path / "reviews.csv", 'key,review,stars\nk1,great,5\nk2,awful,1\nk3,meh\nk4,"fine\nok",3\n')


def test_csv_in_csv_out_with_kept_columns_and_an_id_column(tmp_path, reviews):
    out = tmp_path / "out.csv"
    r = run(reviews, "--template", "Rate: {review}", "--id-column", "key", "--keep-columns", "stars,review",
            "-o", out, *FAST, reply=lambda prompt: prompt.upper())
    assert r.exit_code == 0, r.stderr
    rows = csv_rows(out)
    assert [list(row) for row in rows][0] == ["row", "id", "stars", "review", "response", "finish_reason",
                                              "error_code", "error", "prompt_tokens", "completion_tokens"]
    assert [(x["row"], x["id"], x["stars"], x["response"], x["finish_reason"]) for x in rows] == [
        ("1", "k1", "5", "RAT", "length"), ("2", "k2", "1", "RAT", "length"), ("3", "3", "", "", "error"),
        ("4", "k4", "3", "RAT", "length")]
    assert rows[2]["error_code"] == "invalid_row" and "has 2 field(s); the header has 3" in rows[2]["error"]
    assert rows[3]["review"] == "fine\nok"
    assert int(rows[0]["prompt_tokens"]) > 0 and rows[0]["completion_tokens"] == "3"
    # the records file beside it holds the same answers as JSONL records
    records = [json.loads(x) for x in (tmp_path / "out.csv.records.jsonl").read_text().splitlines()]
    assert [x["row"] for x in records] == [1, 2, 3, 4]
    assert records[0]["input"] == {"stars": "5", "review": "great"}


def test_table_input_to_jsonl_records_carries_row_and_kept_columns(tmp_path, reviews):
    out = tmp_path / "out.jsonl"
    r = run(reviews, "--template", "{review}", "--keep-columns", "key", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["id"], x["row"], x["input"]) for x in records] == [
        (1, 1, {"key": "k1"}), (2, 2, {"key": "k2"}), (3, 3, {"key": None}), (4, 4, {"key": "k4"})]
    assert not (tmp_path / "out.jsonl.records.jsonl").exists()


def test_stdout_gets_jsonl_records(reviews):
    r = run(reviews, "--template", "{review}", *FAST)
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["row"] for x in r.stdout.splitlines()] == [1, 2, 3, 4]


def test_parquet_in_parquet_out_keeps_types(tmp_path):
    src = write_parquet(tmp_path / "in.parquet", {"text": ["a", "b", None], "n": [1, 2, 3],
                                                  "score": [0.5, 1.5, 2.5]}, row_group_size=2)
    out = tmp_path / "out.parquet"
    r = run(src, "--template", "{text}", "--keep-columns", "all", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    table = pq.read_table(out)
    assert table.schema.field("n").type == pa.int64() and table.schema.field("score").type == pa.float64()
    assert table.schema.field("row").type == pa.int64() and table.schema.field("prompt_tokens").type == pa.int64()
    rows = table.to_pylist()
    assert [(x["row"], x["text"], x["n"], x["finish_reason"]) for x in rows] == [
        (1, "a", 1, "stop"), (2, "b", 2, "stop"), (3, None, 3, "error")]
    assert "column 'text' is null" in rows[2]["error"]


def test_sqlite_output_one_row_per_input_row_in_wal_mode(tmp_path, reviews):
    out = tmp_path / "out.db"
    r = run(reviews, "--template", "{review}", "--keep-columns", "review", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    db = sqlite3.connect(out)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("SELECT row, review, finish_reason FROM results ORDER BY row").fetchall() == [
        (1, "great", "length"), (2, "awful", "length"), (3, None, "error"), (4, "fine\nok", "length")]
    db.close()


def test_tsv_output_and_arrow_input(tmp_path):
    src = write_feather(tmp_path / "in.feather", {"q": ["x", "y"]})
    out = tmp_path / "out.tsv"
    r = run(src, "--template", "Q: {q}", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    assert [x["finish_reason"] for x in csv_rows(out, "\t")] == ["length", "length"]


def test_shard_folder_and_hf_dataset_inputs(tmp_path, monkeypatch):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "part-0.parquet", {"text": ["a"]})
    write_parquet(shards / "part-1.parquet", {"text": ["b"]})
    r = run(shards, "--template", "{text}", "-o", tmp_path / "s.csv", *FAST, reply=lambda p: p + "!")
    assert r.exit_code == 0, r.stderr
    assert [x["response"] for x in csv_rows(tmp_path / "s.csv")] == ["a!", "b!"]
    hub = tmp_path / "hub"
    fake_hub(hub, "acme", "qa", {"data/train-00000-of-00001.parquet": {"question": ["why?", "how?"]}})
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    r = run("hf:datasets/acme/qa:train", "--template", "{question}", "-o", tmp_path / "h.csv", *FAST,
            reply=lambda p: p)
    assert r.exit_code == 0, r.stderr
    assert [x["response"] for x in csv_rows(tmp_path / "h.csv")] == ["why", "how"]


def test_system_messages_template_and_template_file(tmp_path, reviews):
    prompts = []
    reply = lambda p: prompts.append(p) or "ok"  # noqa: E731
    tf = tmp_path / "t.txt"
    tf.write_text("Review: {review}\n")
    r = run(reviews, "--template-file", tf, "-o", tmp_path / "a.csv", *FAST, reply=reply)
    assert r.exit_code == 0, r.stderr
    assert "Review: great" in prompts
    mf = tmp_path / "m.json"
    mf.write_text(json.dumps([{"role": "system", "content": "Be {stars}."},
                              {"role": "user", "content": "Say {review}"}]))
    prompts.clear()
    r = run(reviews, "--messages-template", mf, "-o", tmp_path / "b.csv", *FAST, reply=reply)
    assert r.exit_code == 0, r.stderr
    assert any("Be 5." in p and "Say great" in p for p in prompts)  # rendered through the chat template
    r = run(reviews, "--template", "{review}", "--system", "Stars: {stars}", "-o", tmp_path / "c.csv", *FAST,
            reply=reply)
    assert r.exit_code == 0 and any("Stars: 1" in p for p in prompts)


def test_a_prompt_column_is_the_default_template_otherwise_say_so(tmp_path, reviews):
    src = write_csv(tmp_path / "p.csv", "prompt\nhello\n")
    r = run(src, "-o", tmp_path / "o.csv", *FAST, reply=lambda p: p)
    assert r.exit_code == 0 and csv_rows(tmp_path / "o.csv")[0]["response"] == "hel"
    r = run(reviews, "-o", tmp_path / "x.csv", *FAST)
    assert r.exit_code == 1
    assert "is a table: say how a row becomes a prompt with --template" in r.stderr
    assert "its columns: key, review, stars" in r.stderr


def test_bad_tables_and_flags_are_one_line_before_the_model_loads(tmp_path, reviews):
    r = run(reviews, "--template", "{reveiw}", "-o", tmp_path / "o.csv", *FAST)
    assert r.exit_code == 1 and r.engines == []
    assert r.stderr.strip() == (f"llamabatch: error: the template uses {{reveiw}}, which is not a column of "
                                f"{reviews}; its columns: key, review, stars")
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "o.csv.records.jsonl").exists()
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "x"}\n')
    r = run(jsonl, "--template", "{x}", *FAST)
    assert r.exit_code == 2 and "--template read a table INPUT" in r.stderr
    r = run(reviews, "--template", "{review}", "--keep-columns", "nope", *FAST)
    assert r.exit_code == 1 and "--keep-columns names 'nope'" in r.stderr
    r = run(write_csv(tmp_path / "e.csv", ""), "--template", "{x}", *FAST)
    assert r.exit_code == 1 and "is empty: a CSV/TSV input needs a header row" in r.stderr


def test_output_equal_to_or_inside_the_input_is_refused(tmp_path, reviews):
    r = run(reviews, "--template", "{review}", "-o", reviews, *FAST)
    assert r.exit_code == 1 and "is the INPUT file" in r.stderr
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "part-0.parquet", {"text": ["a"]})
    r = run(shards, "--template", "{text}", "-o", shards / "out.parquet", *FAST)
    assert r.exit_code == 1 and "is the INPUT folder or inside it" in r.stderr
    assert reviews.read_text().startswith("key,review,stars")


def test_header_only_csv_is_said_before_the_run_and_gives_an_empty_table(tmp_path):
    src = write_csv(tmp_path / "h.csv", "review\n")
    out = tmp_path / "o.csv"
    r = invoke(["run", str(src), "--template", "{review}", "-o", str(out), "--n-parallel", "2"],
               runner=runner_for())
    assert r.exit_code == 0, r.stderr
    assert f"INPUT {src} has no data rows: nothing to run" in r.stderr
    assert out.read_text().splitlines() == ["row,id,response,finish_reason,error_code,error,prompt_tokens,"
                                            "completion_tokens"]


def test_progress_and_summary_count_rows(tmp_path, reviews):
    r = invoke(["run", str(reviews), "--template", "{review}", "-o", str(tmp_path / "o.csv"), "--n-parallel", "2",
                "--progress-every", "0"], runner=runner_for())
    assert r.exit_code == 0, r.stderr
    assert "llamabatch run: 4 row(s) in" in r.stderr
    assert "llamabatch run: 4/4 rows," in r.stderr
    assert "llamabatch run: row 3 (id 3) failed: invalid_row" in r.stderr


def test_the_last_progress_line_has_the_total_when_counting_lags_the_run(tmp_path, reviews, monkeypatch):
    """The rows are counted on a thread of their own; on a busy machine the run can end first."""
    count = table_input._count_rows

    def slowly(*args):
        time.sleep(0.5)
        return count(*args)
    monkeypatch.setattr(table_input, "_count_rows", slowly)
    r = invoke(["run", str(reviews), "--template", "{review}", "-o", str(tmp_path / "o.csv"), "--progress-every",
                "0"], runner=runner_for())
    assert r.exit_code == 0, r.stderr
    progress = [line for line in r.stderr.splitlines() if re.match(r"llamabatch run: \d+/\S+ rows,", line)]
    assert progress[-1].startswith("llamabatch run: 4/4 rows,"), r.stderr


def test_resume_after_a_kill_completes_the_table_in_row_order(tmp_path):
    src = write_csv(tmp_path / "in.csv", "text\n" + "".join(f"p{i}\n" for i in range(1, 9)))
    out = tmp_path / "out.csv"
    args = [src, "--template", "{text}", "-o", out, *FAST]
    assert run(*args, reply=lambda p: p).exit_code == 0
    records = (tmp_path / "out.csv.records.jsonl").read_text().splitlines(keepends=True)
    # what a kill -9 leaves: rows 1, 2 and 5 answered (5 ahead of a cancelled 3 and 4), a torn
    # record being written, and no table (the kill came before the end)
    kept = [records[0], records[1], records[4], records[5][:20]]
    (tmp_path / "out.csv.records.jsonl").write_text("".join(kept))
    out.unlink()
    seen = []
    r = run(*args, "--resume", reply=lambda p: seen.append(p) or p)
    assert r.exit_code == 0, r.stderr
    assert sorted(seen) == ["p3", "p4", "p6", "p7", "p8"]  # the answered rows are not run again
    rows = csv_rows(out)
    assert [x["row"] for x in rows] == [str(i) for i in range(1, 9)]
    assert [x["response"] for x in rows] == [f"p{i}" for i in range(1, 9)]


def test_a_stopped_run_writes_the_rows_answered_so_far_and_resume_completes_them(tmp_path):
    src = write_csv(tmp_path / "in.csv", "text\n" + "".join(f"p{i}\n" for i in range(1, 41)))
    out = tmp_path / "out.csv"
    args = [src, "--template", "{text}", "-o", out, "--n-parallel", "1", "--max-inflight", "1", "--max-tokens", "2"]
    interrupted = []

    def ctrl_c_once(step, plan):  # Ctrl-C as a row decodes: that row finishes, no more are read
        # once the run's own handler is in place: the engine's first step can come before it (a
        # loaded machine), and Python's default handler would end the run another way
        if not interrupted and isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), Interrupts):
            interrupted.append(step)
            os.kill(os.getpid(), signal.SIGINT)

    r = invoke(["run", *map(str, args)], runner=runner_for(hook=ctrl_c_once, step_delay=0.02))
    assert r.exit_code == 130, r.stderr
    done = csv_rows(out)
    assert 1 <= len(done) < 40
    assert "the rows answered so far; --resume completes it" in r.stderr
    r = run(*args, "--resume")
    assert r.exit_code == 0, r.stderr
    assert [x["row"] for x in csv_rows(out)] == [str(i) for i in range(1, 41)]


def test_jsonl_input_to_a_table_output(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "yo"}\n')
    out = tmp_path / "o.csv"
    r = run(src, "-o", out, *FAST, reply=lambda p: p)
    assert r.exit_code == 0, r.stderr
    assert [(x["id"], x["response"]) for x in csv_rows(out)] == [("a", "hi"), ("b", "yo")]
    assert "row" not in csv_rows(out)[0]


def test_logprobs_opt_in_column(tmp_path, reviews):
    out = tmp_path / "o.csv"
    r = run(reviews, "--template", "{review}", "--logprobs", "0", "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    first = json.loads(csv_rows(out)[0]["logprobs"])
    assert len(first) == 3 and "logprob" in first[0]
    r = run(reviews, "--template", "{review}", "-o", tmp_path / "n.csv", *FAST)
    assert "logprobs" not in csv_rows(tmp_path / "n.csv")[0]


def test_missing_pyarrow_for_parquet_output_is_one_line(tmp_path, reviews, monkeypatch):
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    r = run(reviews, "--template", "{review}", "-o", tmp_path / "o.parquet", *FAST)
    assert r.exit_code == 1 and r.engines == []
    assert r.stderr.strip() == (f"llamabatch: error: writing Parquet ({tmp_path / 'o.parquet'}) needs pyarrow, "
                                "which is not installed: pip install 'llamabatch[tables]'")


def test_resume_with_another_template_is_refused(tmp_path, reviews):
    out = tmp_path / "out.csv"
    assert run(reviews, "--template", "Rate: {review}", "-o", out, *FAST).exit_code == 0
    r = run(reviews, "--template", "Score: {review}", "-o", out, "--resume", *FAST)
    assert r.exit_code == 2
    assert "cannot resume: the settings differ" in r.stderr and "table.template" in r.stderr
    r = run(reviews, "--template", "Rate: {review}", "-o", out, "--resume", *FAST)
    assert r.exit_code == 0, r.stderr


def test_dry_run_reads_the_table_and_writes_nothing(tmp_path, reviews):
    out = tmp_path / "out.csv"
    r = run(reviews, "--template", "Rate: {review}", "-o", out, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["lines"], report["valid"], report["invalid_by_code"]) == (4, 3, {"invalid_row": 1})
    assert report["first_errors"] == ["invalid_row: row 3 (line 4) has 2 field(s); the header has 3"]
    assert not out.exists() and not (tmp_path / "out.csv.records.jsonl").exists()
    assert run(reviews, "--template", "Rate: {review}", "-o", out, *FAST).exit_code == 0
    r = run(reviews, "--template", "Rate: {review}", "-o", out, "--dry-run", "--resume", "--json")
    assert json.loads(r.stdout)["resume"]["already_answered"] == 4


def test_a_table_from_stdin_is_one_line(tmp_path):
    r = invoke(["run", "-", "--delimiter", ",", "--template", "{a}", "-q"], input="a\n1\n", runner=runner_for())
    assert r.exit_code == 1 and "a table INPUT is a file" in r.stderr
