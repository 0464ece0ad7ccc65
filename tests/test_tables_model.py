"""`run` over tables on the bundled model, in real processes: one end-to-end run per input and
output format, and kill -9 + --resume for CSV and Parquet outputs (no answered row lost, the
table completed, no row run twice). Few rows, few tokens: the whole file stays well under a
minute on 2 cores."""
from __future__ import annotations

import csv
import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from table_files import fake_hub, write_csv, write_feather, write_parquet
from lazy_modules import lazy

pq = lazy("pyarrow.parquet")

pytestmark = pytest.mark.model

FAST = ["--n-parallel", "2", "--n-ctx", "512", "--temperature", "0", "--progress-every", "1000"]
COUNTRIES = ["France", "Japan", "Kenya", "Peru"]
TEMPLATE = "Country: Italy\nCapital: Rome\nCountry: {country}\nCapital:"


@pytest.fixture(autouse=True)
def bundled_model(model_path, monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)


def real_run(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamabatch", "run", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def csv_rows(path, delimiter=","):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter=delimiter))


def check_capitals(responses):
    # the bundled 270M model answers these few-shot prompts right; greedy, so every run the same
    assert [r.strip() for r in responses] == ["Paris", "Tokyo", "Nairobi", "Lima"]


def test_csv_in_csv_out(tmp_path):
    src = write_csv(tmp_path / "in.csv", "code,country\n" + "".join(f"c{i},{c}\n" for i, c in enumerate(COUNTRIES)))
    out = tmp_path / "out.csv"
    r = real_run(src, "--template", TEMPLATE, "--id-column", "code", "--keep-columns", "country", "-o", out,
                 "--max-tokens", "4", "--stop", "\n", *FAST)
    assert r.returncode == 0, r.stderr
    rows = csv_rows(out)
    assert [(x["id"], x["country"], x["finish_reason"]) for x in rows] == [
        (f"c{i}", c, "stop") for i, c in enumerate(COUNTRIES)]
    check_capitals([x["response"] for x in rows])
    assert "4 row(s) in" in r.stderr and "wrote 4 row(s) to" in r.stderr


def test_tsv_in_tsv_out(tmp_path):
    src = write_csv(tmp_path / "in.tsv", "country\n" + "".join(f"{c}\n" for c in COUNTRIES))
    out = tmp_path / "out.tsv"
    r = real_run(src, "--template", TEMPLATE, "-o", out, "--max-tokens", "4", "--stop", "\n", *FAST)
    assert r.returncode == 0, r.stderr
    check_capitals([x["response"] for x in csv_rows(out, "\t")])


def test_parquet_in_parquet_out(tmp_path):
    src = write_parquet(tmp_path / "in.parquet", {"country": COUNTRIES, "n": [1, 2, 3, 4]}, row_group_size=2)
    out = tmp_path / "out.parquet"
    r = real_run(src, "--template", TEMPLATE, "--keep-columns", "all", "-o", out, "--max-tokens", "4",
                 "--stop", "\n", "--logprobs", "1", *FAST)
    assert r.returncode == 0, r.stderr
    rows = pq.read_table(out).to_pylist()
    assert [(x["row"], x["n"]) for x in rows] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    check_capitals([x["response"] for x in rows])
    assert all(len(json.loads(x["logprobs"])) == x["completion_tokens"] for x in rows)


def test_feather_in_sqlite_out(tmp_path):
    src = write_feather(tmp_path / "in.feather", {"country": COUNTRIES})
    out = tmp_path / "out.sqlite"
    r = real_run(src, "--template", TEMPLATE, "-o", out, "--max-tokens", "4", "--stop", "\n", *FAST)
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(out)
    check_capitals([x for (x,) in db.execute("SELECT response FROM results ORDER BY row")])
    db.close()


def test_hf_dataset_in_jsonl_out(tmp_path):
    hub = tmp_path / "hub"
    fake_hub(hub, "acme", "countries", {"data/train-00000-of-00001.parquet": {"country": COUNTRIES}})
    out = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, "-m", "llamabatch", "run", "hf:datasets/acme/countries", "--template",
                        TEMPLATE, "--keep-columns", "country", "-o", str(out), "--max-tokens", "4", "--stop", "\n",
                        *FAST], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "HF_HUB_CACHE": str(hub)})
    assert r.returncode == 0, r.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["row"], x["input"]["country"]) for x in records] == [(i + 1, c) for i, c in enumerate(COUNTRIES)]
    check_capitals([x["text"] for x in records])


def _kill_and_resume(tmp_path, src, out, read_table):
    """Start a run, kill -9 it once some rows are answered, resume, and check the table."""
    records_file = tmp_path / (out.name + ".records.jsonl")
    args = [src, "--template", "Write a short story about {thing}:", "-o", out, "--max-tokens", "6",
            "--n-parallel", "2", "--n-ctx", "512", "--temperature", "0", "-q"]
    proc = subprocess.Popen([sys.executable, "-m", "llamabatch", "run", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if records_file.exists() and records_file.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    answered = [json.loads(x) for x in records_file.read_text().splitlines(keepends=True) if x.endswith("\n")]
    assert 2 <= len(answered) < 12, "the run finished before it could be killed"
    assert not out.exists()  # the table is written when a run ends; a killed run never got there
    resumed = subprocess.run([sys.executable, "-m", "llamabatch", "run", *map(str, args), "--resume"],
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    rows = read_table(out)
    assert [int(x["row"]) for x in rows] == list(range(1, 13))  # every row once, in input order
    assert all(x["finish_reason"] == "length" and int(x["completion_tokens"]) == 6 for x in rows)
    for record in answered:  # the answers from before the kill are kept, not run again
        assert rows[record["row"] - 1]["response"] == record["text"]


def test_kill_9_and_resume_completes_a_csv_table(tmp_path):
    src = write_csv(tmp_path / "in.csv", "thing\n" + "".join(f"thing number {i}\n" for i in range(12)))
    _kill_and_resume(tmp_path, src, tmp_path / "out.csv", csv_rows)


def test_kill_9_and_resume_completes_a_parquet_table(tmp_path):
    src = write_parquet(tmp_path / "in.parquet", {"thing": [f"thing number {i}" for i in range(12)]})
    _kill_and_resume(tmp_path, src, tmp_path / "out.parquet", lambda p: pq.read_table(p).to_pylist())
