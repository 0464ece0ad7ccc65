"""Long jobs: `run --dry-run`, the run manifest, the settings fingerprint on
--resume, --error-file, --retry-failed and its crash-safe merge, the OUTPUT lock, and
`llamabatch report`. On the scripted fake runner in-process; the bundled-model end to end
with a kill -9 during --retry-failed is at the bottom (marked `model`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import invoke, runner_for
from test_run_cli import FAST, bundled_env, llamabatch_run, read_records, real_run, slow_lines, the_id, wait_for_lines, write_lines

from llamabatch.files import model_digest as model_hash
from llamabatch.jobs.resume.fingerprint import changes
from llamabatch.jobs.resume.manifest import VERSION, manifest_path, read_manifest, ManifestProblem
from llamabatch.jobs.writing.output_lock import OutputLock
from llamabatch.jobs.resume.retry_journal import RETRYABLE, journal_path, merge_journal


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch, request):
    if request.node.get_closest_marker("model"):
        return  # the real model, its real cache
    # the calibration and model-hash caches of these tests are their own
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))
    # the fake runner stands in for a model file of its own: the bundled one would be assembled
    # into this private cache (250 MB) and hashed for every test
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setenv("LLAMABATCH_MODEL", str(fake))


LINES = [{"id": "a", "prompt": "A is for"}, {"id": "b", "prompt": "B is for"}, {"id": "c", "prompt": "C is for"}]


def timeout_record(line_id: str) -> dict:
    return {"id": line_id, "text": "", "finish_reason": "timeout", "usage": None, "timings": None, "seed": None,
            "error": {"code": "timeout", "message": "the request's timeout passed before it finished"}}


def first_run(tmp_path: Path, lines=LINES, *extra: str) -> tuple[Path, Path]:
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, *extra)
    assert proc.returncode == 0, proc.stderr
    return inp, out


def replace_record(out: Path, line_id: str, record: dict) -> None:
    records = read_records(out)
    out.write_text("".join(json.dumps(record if the_id(r) == line_id else r) + "\n" for r in records))


# -- the manifest -----------------------------------------------------------------------------


def test_manifest_says_what_produced_output(tmp_path):
    inp, out = first_run(tmp_path, LINES + [{"foo": 1}])
    m = read_manifest(manifest_path(str(out)))
    assert m["status"] == "finished"
    assert m["model"]["sha256"] and len(m["model"]["sha256"]) == 64
    assert m["sampling"]["max_tokens"] == 4 and m["sampling"]["temperature"] == 0
    assert m["engine"]["n_parallel"] == 4
    assert m["input"]["lines"] == 4 and m["input"]["size"] == inp.stat().st_size
    assert m["counts"]["records"] == 4
    assert m["counts"]["error_code"] == {"unknown_shape": 1}
    assert m["counts"]["finish_reason"]["error"] == 1
    assert m["tokens"]["generated"] == sum(r["usage"]["completion_tokens"] for r in read_records(out) if r["usage"])
    assert [h["event"] for h in m["history"]] == ["start"]
    assert m["history"][0]["records_written"] == 4
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")], "atomic writes leave no temporary file"
    assert not (tmp_path / "out.jsonl.lock").exists()


def test_no_manifest_for_stdout(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    proc = llamabatch_run(str(inp), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 3
    assert not list(tmp_path.glob("*.manifest.json"))


# -- the fingerprint on --resume ----------------------------------------------------------------


def test_resume_with_changed_settings_is_refused_naming_each_change(tmp_path):
    inp, out = first_run(tmp_path)
    before = out.read_bytes()
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--temperature", "0.7", "--system", "Be brief.",
                          "--resume")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "sampling.temperature: 0.0 → 0.7" in line and 'system: null → "Be brief."' in line
    assert "--allow-changed-settings" in line
    assert out.read_bytes() == before


def test_allow_changed_settings_resumes_and_records_the_change(tmp_path):
    inp, out = first_run(tmp_path)
    more = write_lines(inp, LINES + [{"id": "d", "prompt": "D is for"}])
    proc = llamabatch_run(str(more), "-o", str(out), *FAST, "--temperature", "0.7", "--resume",
                          "--allow-changed-settings")
    assert proc.returncode == 0, proc.stderr
    assert [the_id(r) for r in read_records(out)] == ["a", "b", "c", "d"]
    m = read_manifest(manifest_path(str(out)))
    assert [h["event"] for h in m["history"]] == ["start", "resume"]
    assert m["history"][1]["changed_settings"] == ["sampling.temperature: 0.0 → 0.7"]
    assert m["fingerprint"]["sampling"]["temperature"] == 0.7  # what the file holds from now on
    assert m["counts"]["records"] == 4


def test_a_timeout_change_is_not_a_settings_change(tmp_path):
    inp, out = first_run(tmp_path)
    config = tmp_path / "t.toml"
    config.write_text("[sampling]\ntimeout = 30\n")
    proc = invoke(["--config", str(config), "run", str(inp), "-o", str(out), *FAST, "--resume"], runner=runner_for())
    assert proc.exit_code == 0, proc.stderr
    assert read_manifest(manifest_path(str(out)))["sampling"]["timeout"] == 30  # this invocation's settings
    proc = invoke(["--config", str(config), "run", str(inp), "-o", str(out), *FAST, "--resume", "--top-k", "3"],
                  runner=runner_for())
    assert proc.exit_code == 2 and "sampling.top_k: 40 → 3" in proc.stderr and "sampling.timeout" not in proc.stderr


@pytest.mark.parametrize("damage, said", [
    (None, "no manifest"),
    ('{"format": "llamabatch-run-manifest", "vers', "not valid JSON (truncated?)"),
    (json.dumps({"format": "llamabatch-run-manifest", "version": VERSION + 1}), "newer than this llamabatch reads"),
])
def test_a_missing_torn_or_newer_manifest_stops_resume_in_one_line(tmp_path, damage, said):
    inp, out = first_run(tmp_path)
    path = Path(manifest_path(str(out)))
    if damage is None:
        path.unlink()
    else:
        path.write_text(damage)
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert said in proc.stderr and "--allow-changed-settings" in proc.stderr
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume", "--allow-changed-settings")
    assert proc.returncode == 0, proc.stderr
    m = read_manifest(str(path))
    assert said in m["history"][-1]["overridden"]


def test_changes_names_old_and_new():
    old = {"model_sha256": "a" * 64, "sampling": {"top_k": 40, "stop": []}, "deterministic": False}
    new = {"model_sha256": "b" * 64, "sampling": {"top_k": 20, "stop": ["\n"]}, "deterministic": False}
    assert changes(old, new) == ["model_sha256: aaaaaaaaaaaa → bbbbbbbbbbbb", "sampling.stop: [] → [\"\\n\"]",
                                 "sampling.top_k: 40 → 20"]
    assert changes(old, old) == []


def test_model_sha256_is_hashed_once_per_file(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + os.urandom(1000))
    calls = []
    real = model_hash.sha256_file
    monkeypatch.setattr(model_hash, "sha256_file", lambda p, **kw: calls.append(p) or real(p, **kw))
    first = model_hash.model_sha256(str(model))
    assert model_hash.model_sha256(str(model)) == first and len(calls) == 1
    os.utime(model, ns=(1, 1))  # touched: hashed again
    assert model_hash.model_sha256(str(model)) == first and len(calls) == 2
    assert model_hash.model_sha256(str(tmp_path / "missing.gguf")) is None


# -- the error file --------------------------------------------------------------------------


def test_error_file_takes_failed_lines_and_resume_reads_both(tmp_path):
    lines = LINES + [{"foo": 1}, {"id": "e", "prompt": "x", "max_tokens": "ten"}]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out, err = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), "--error-file", str(err), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert [the_id(r) for r in read_records(out)] == ["a", "b", "c"]
    assert all(r["error"] is None for r in read_records(out))
    assert sorted(r["error"]["code"] for r in read_records(err)) == ["invalid_request", "unknown_shape"]
    proc = llamabatch_run(str(inp), "-o", str(out), "--error-file", str(err), *FAST, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "5 record(s) already in" in proc.stderr
    assert len(read_records(out)) == 3 and len(read_records(err)) == 2
    m = read_manifest(manifest_path(str(out)))
    assert m["counts"]["records"] == 5 and m["output"]["error_file"] == str(err)


def test_error_file_for_openai_lines_is_openai_shaped(tmp_path):
    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/completions", "body": {"prompt": "1, 2,"}},
             {"custom_id": "bad", "method": "POST", "url": "/v1/moderations", "body": {}}]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert llamabatch_run(str(inp), "-o", str(out), "--error-file", str(err), *FAST).returncode == 0
    [bad] = read_records(err)
    assert bad["custom_id"] == "bad" and bad["response"]["status_code"] == 400 and bad["error"]["code"] == "invalid_url"
    assert [r["custom_id"] for r in read_records(out)] == ["ok"]


def test_error_file_must_differ_from_output(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    out = tmp_path / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), "--error-file", str(out), *FAST)
    assert proc.returncode == 2 and "is OUTPUT" in proc.stderr
    proc = llamabatch_run(str(inp), "--error-file", str(tmp_path / "e.jsonl"), *FAST)
    assert proc.returncode == 2 and "regular file" in proc.stderr


# `--error-file OUTPUT.manifest.json` was once accepted; the error records went there and the
# manifest was then renamed over them, so those lines had no record anywhere
OWN_FILES = {
    "the manifest": lambda d: d / "out.jsonl.manifest.json",
    "the lock file": lambda d: d / "out.jsonl.lock",
    "the retry journal": lambda d: d / "out.jsonl.retry.jsonl",
    "the manifest's temporary file": lambda d: d / f".out.jsonl.manifest.json.{os.getpid()}.tmp",
    "OUTPUT spelled relative": lambda d: Path(os.path.relpath(d / "out.jsonl")),
    "OUTPUT spelled with ..": lambda d: d / "sub" / ".." / "out.jsonl",
    "a symlink to the manifest": lambda d: _link(d / "link.json", d / "out.jsonl.manifest.json"),
    "INPUT": lambda d: d / "in.jsonl",
}


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


@pytest.mark.parametrize("name", sorted(OWN_FILES))
def test_error_file_may_not_be_a_file_the_run_writes(tmp_path, name):
    lines = LINES + [{"foo": 1}, "{bad"]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    (tmp_path / "sub").mkdir()
    out = tmp_path / "out.jsonl"
    error_file = OWN_FILES[name](tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = llamabatch_run(str(inp), "-o", str(out), "--error-file", str(error_file), *FAST)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"llamabatch: error: --error-file {error_file} is ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "refused before anything is written"
    # the same paths in an earlier run's folder: a resume is refused too, and nothing is lost
    first_run(tmp_path, lines, "--error-file", str(tmp_path / "errors.jsonl"))
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    proc = llamabatch_run(str(inp), "-o", str(out), "--error-file", str(error_file), *FAST, "--resume")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == kept


def test_error_file_may_not_be_a_file_a_table_output_writes(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    table = tmp_path / "t.csv"
    before = sorted(p.name for p in tmp_path.iterdir())
    for own in (table, tmp_path / "t.csv.records.jsonl", tmp_path / "t.csv.records.jsonl.manifest.json",
                tmp_path / f".t.csv.{os.getpid()}.tmp"):
        proc = llamabatch_run(str(inp), "-o", str(table), "--error-file", str(own), *FAST)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert f"--error-file {own} is " in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_error_file_of_its_own_is_still_taken(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES + [{"foo": 1}])
    out, err = tmp_path / "out.jsonl", tmp_path / "out.jsonl.errors.jsonl"  # a name that only looks like one
    assert llamabatch_run(str(inp), "-o", str(out), "--error-file", str(err), *FAST).returncode == 0
    assert [r["error"]["code"] for r in read_records(err)] == ["unknown_shape"]
    assert len(read_records(out)) == 3


# -- --retry-failed ----------------------------------------------------------------------------


def test_retry_failed_replaces_the_error_in_place(tmp_path):
    inp, out = first_run(tmp_path)
    answer = read_records(out)[1]["text"]
    replace_record(out, "b", timeout_record("b"))
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume", "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert "retried 1 line(s); 1 record(s) replaced in place" in proc.stderr
    records = read_records(out)
    assert [the_id(r) for r in records] == ["a", "b", "c"]  # in its old place, one record per id
    assert records[1]["error"] is None and records[1]["text"] == answer
    assert not Path(journal_path(str(out))).exists()
    m = read_manifest(manifest_path(str(out)))
    assert m["history"][-1]["event"] == "retry-failed" and m["counts"]["error_code"] == {}


def test_retry_failed_leaves_errors_of_the_line_itself(tmp_path):
    inp, out = first_run(tmp_path, LINES + [{"foo": 1}])
    before = out.read_bytes()
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume", "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == before  # unknown_shape is not retried: the same line fails the same way
    assert "unknown_shape" not in RETRYABLE and "length" not in RETRYABLE and "timeout" in RETRYABLE


def test_retry_failed_needs_resume(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    proc = llamabatch_run(str(inp), "-o", str(tmp_path / "o.jsonl"), *FAST, "--retry-failed")
    assert proc.returncode == 2 and "--resume" in proc.stderr


def test_retry_failed_with_error_file_moves_the_success_to_output(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert llamabatch_run(str(inp), "-o", str(out), "--error-file", str(err), *FAST).returncode == 0
    records = read_records(out)  # as if c had timed out in that run
    out.write_text("".join(json.dumps(r) + "\n" for r in records if r["id"] != "c"))
    err.write_text(json.dumps(timeout_record("c")) + "\n")
    proc = llamabatch_run(str(inp), "-o", str(out), "--error-file", str(err), *FAST, "--resume", "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert [the_id(r) for r in read_records(out)] == ["a", "b", "c"]
    assert read_records(err) == []


def test_merge_is_idempotent_after_a_kill_at_any_step(tmp_path):
    """The states a kill -9 can leave, each merged (again) by the next run: never two records
    for an id in OUTPUT and the error file together, never a lost answer."""
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    ok = {"id": "c", "text": "C!", "finish_reason": "stop", "usage": None, "timings": None, "seed": 1, "error": None}
    a = {**ok, "id": "a", "text": "A!"}

    def state(out_records, err_records, journal_text):
        out.write_text("".join(json.dumps(r) + "\n" for r in out_records))
        err.write_text("".join(json.dumps(r) + "\n" for r in err_records))
        Path(journal_path(str(out))).write_text(journal_text)

    def ids():
        return sorted(the_id(r) for r in read_records(out) + read_records(err))

    # killed before the merge began: the journal holds c's new answer (and a torn half record)
    state([a], [timeout_record("c")], json.dumps(ok) + "\n" + '{"id": "d", "te')
    assert merge_journal(str(out), str(err)).appended == 1
    assert ids() == ["a", "c"] and read_records(err) == [] and read_records(out)[1] == ok
    assert not Path(journal_path(str(out))).exists()
    # killed after the error file was rewritten, before the append: c is only in the journal
    state([a], [], json.dumps(ok) + "\n")
    merge_journal(str(out), str(err))
    assert ids() == ["a", "c"]
    # killed after the append, before the journal was removed: nothing is added twice
    state([a, ok], [], json.dumps(ok) + "\n")
    merge_journal(str(out), str(err))
    assert ids() == ["a", "c"]
    # inline, killed after the rename: the record is no longer a retryable error, so it stays
    state([a, ok], [], json.dumps({**ok, "text": "other"}) + "\n")
    merge_journal(str(out), None)
    assert read_records(out) == [a, ok]
    assert merge_journal(str(out), None) is None  # no journal: nothing to do


def test_a_resume_finishes_a_merge_a_kill_left_undone(tmp_path):
    inp, out = first_run(tmp_path)
    records = read_records(out)
    replace_record(out, "b", timeout_record("b"))
    Path(journal_path(str(out))).write_text(json.dumps(records[1]) + "\n")
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "finished an interrupted --retry-failed: 1 record(s) replaced" in proc.stderr
    assert read_records(out) == records


# -- the lock ----------------------------------------------------------------------------------


def test_a_second_run_on_the_same_output_is_refused(tmp_path):
    inp, out = first_run(tmp_path)
    before = out.read_bytes()
    with OutputLock(str(out)):
        proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume")
    assert proc.returncode == 1
    assert f"another llamabatch run (pid {os.getpid()}) is writing" in proc.stderr
    assert out.read_bytes() == before
    assert llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume").returncode == 0  # released


def test_lock_is_released_by_a_killed_process(tmp_path):
    out = tmp_path / "out.jsonl"
    code = f"from llamabatch.jobs.writing.output_lock import OutputLock; OutputLock({str(out)!r}).acquire(); " \
           "print('locked', flush=True); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(Exception, match="is writing"):
            OutputLock(str(out)).acquire()
    finally:
        proc.kill()
        proc.wait()
    OutputLock(str(out)).acquire().release()  # the kernel dropped the dead process's flock


# -- --dry-run ---------------------------------------------------------------------------------


def test_dry_run_counts_tokens_and_errors_and_writes_nothing(tmp_path):
    lines = [{"id": "a", "prompt": "shared prefix, then A"}, {"id": "b", "prompt": "shared prefix, then B"},
             {"foo": 1}, {"id": "a", "prompt": "dup"}, {"id": "long", "prompt": "x" * 300},
             {"id": "m", "prompt": "hi", "max_tokens": 10}]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["lines"] == 6 and r["valid"] == 3 and r["invalid"] == 3
    assert r["invalid_by_code"] == {"context_overflow": 1, "duplicate_id": 1, "unknown_shape": 1}
    assert len(r["first_errors"]) == 3
    # fake tokenizer: one token per character
    assert r["prompt_tokens"] == {"total": 21 + 21 + 2, "max": 21, "p50": 21, "p95": 21}
    assert r["prefix_reuse_tokens"] == len("shared prefix, then ")
    assert r["max_output_tokens"] == 4 + 4 + 10
    assert r["slots"] == {"n_parallel": 4, "slot_ctx": 256, "source": "--n-parallel", "n_ctx": 1024,
                          "kv_unified": False, "context_reason": "n_ctx 1,024 as set by --n-ctx"}
    assert r["eta"]["low_s"] is None and "no calibration" in r["eta"]["basis"]
    assert not out.exists() and not list(tmp_path.glob("out.jsonl*"))


def test_dry_run_eta_comes_from_the_calibration_with_its_basis(tmp_path):
    from llamabatch.llama import autoslots

    inp = write_lines(tmp_path / "in.jsonl", [{"id": "a", "prompt": "abc", "max_tokens": 100}])
    from llamabatch.kernel_paths.cpu_buffers import chosen

    model = str(tmp_path / "fake.gguf")
    key = autoslots.cache_key(model, 2, chosen(None))  # the layout is in the key: LLAMABATCH_CPU_BUFFERS=plain runs too
    autoslots.write_cache(key, {"measured": {4: 40.0, 8: 50.0}, "kv_bytes_per_token": 1000, "at": 1796098148})
    proc = llamabatch_run(str(inp), "--threads", "2", "--n-parallel", "4", "--n-ctx", "1024", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    eta = json.loads(proc.stdout)["eta"]
    assert eta["decode_tok_s"] == 40.0 and eta["slots"] == 4
    assert eta["low_s"] == 2.5 and eta["high_s"] == round((100 + 3) / 40, 1)
    assert eta["basis"].startswith("estimate: 40.0 decode tok/s at 4 slots")
    human = llamabatch_run(str(inp), "--threads", "2", "--n-parallel", "4", "--n-ctx", "1024", "--dry-run")
    assert "ETA            0:02 to 0:03 (estimate: " in human.stdout


def test_dry_run_resume_reports_what_is_left_and_ids_not_in_input(tmp_path):
    inp, out = first_run(tmp_path)
    replace_record(out, "b", timeout_record("b"))
    with out.open("a") as f:
        f.write(json.dumps({**timeout_record("zz"), "finish_reason": "stop", "error": None}) + "\n")
    before = out.read_bytes()
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--dry-run", "--resume", "--retry-failed", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["resume"]["already_answered"] == 2 and r["resume"]["retried"] == 1
    assert r["resume"]["not_in_input"] == 1 and r["resume"]["not_in_input_ids"] == ["zz"]
    assert r["valid"] == 1
    human = llamabatch_run(str(inp), "-o", str(out), *FAST, "--dry-run", "--resume")
    assert 'not in INPUT   1 record(s) in OUTPUT answer no INPUT line: "zz"' in human.stdout
    assert out.read_bytes() == before


# -- report ------------------------------------------------------------------------------------


def _damaged(manifest: dict, **fields) -> bytes:
    return json.dumps({**manifest, **fields}).encode()


# each of these once ended `run --resume` (with the override too) or `report` in a traceback
DAMAGED_MANIFESTS = {
    "bytes": lambda m: b"\x00\xff",
    "history not a list": lambda m: _damaged(m, history="x"),
    "history entry not an object": lambda m: _damaged(m, history=[1]),
    "model a string": lambda m: _damaged(m, model="x"),
    "fingerprint a list": lambda m: _damaged(m, fingerprint=[1]),
    "a 400-digit wall time": lambda m: _damaged(m, history=[{**m["history"][0], "wall_s": 10 ** 400}]),
    "changed settings not text": lambda m: _damaged(m, history=[{**m["history"][0], "changed_settings": [1]}]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_MANIFESTS))
def test_a_damaged_manifest_is_one_line_and_the_override_starts_a_new_one(tmp_path, damage):
    inp, out = first_run(tmp_path)
    path = Path(manifest_path(str(out)))
    path.write_bytes(DAMAGED_MANIFESTS[damage](json.loads(path.read_text())))
    for args in (["--json"], []):
        report = invoke(["report", str(out), *args])
        lines = report.stderr.splitlines()
        assert report.exit_code == 1 and report.stdout == "" and len(lines) == 1, report.stderr
        assert lines[0].startswith("llamabatch: error: ") and str(path) in lines[0]
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cannot check the settings of this resume" in proc.stderr and "--allow-changed-settings" in proc.stderr
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume", "--allow-changed-settings")
    assert proc.returncode == 0, proc.stderr
    m = read_manifest(str(path))  # a new manifest, readable, that says what it overrode
    assert [h["event"] for h in m["history"]] == ["resume"]
    assert str(path) in m["history"][0]["overridden"]
    assert isinstance(m["model"], dict) and m["counts"]["records"] == len(LINES)
    assert invoke(["report", str(out)]).exit_code == 0


def test_report_prints_the_manifest_as_a_table_and_as_json(tmp_path):
    inp, out = first_run(tmp_path)
    table = invoke(["report", str(out)])
    assert table.exit_code == 0, table.stderr
    assert "finished" in table.stdout and "model sha256" in table.stdout and "length 3" in table.stdout
    data = invoke(["report", str(out), "--json"])
    assert json.loads(data.stdout) == read_manifest(manifest_path(str(out)))
    missing = invoke(["report", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 1 and "no manifest" in missing.stderr


def test_read_manifest_refuses_what_is_not_one(tmp_path):
    path = tmp_path / "x.manifest.json"
    path.write_text("[]")
    with pytest.raises(ManifestProblem, match="not a llamabatch run manifest"):
        read_manifest(str(path))


def test_resume_of_an_output_with_no_record_yet_needs_no_manifest(tmp_path):
    # a run killed while the model loaded leaves an empty OUTPUT and no manifest: nothing to mix
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    out = tmp_path / "out.jsonl"
    out.write_text("")
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert len(read_records(out)) == 3
    assert read_manifest(manifest_path(str(out)))["history"][0]["event"] == "resume"


# -- the bundled model, end to end ------------------------------------------------------------


@pytest.mark.model
def test_kill_9_during_retry_failed_loses_nothing_and_never_doubles_an_id(tmp_path, model_path, monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    lines = slow_lines(8, max_tokens=8)
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    args = [str(inp), "-o", str(out), *FAST, "--order", "completion", "-q"]
    # the first run: a default timeout no line can meet, so every line gets a retryable error
    config = tmp_path / "timeout.toml"
    config.write_text("[sampling]\ntimeout = 0.001\n")
    first = subprocess.run([sys.executable, "-m", "llamabatch", "--config", str(config), "run", *args],
                           capture_output=True, text=True, timeout=300, env=bundled_env())
    assert first.returncode == 0, first.stderr
    assert {r["error"]["code"] for r in read_records(out)} == {"timeout"} and len(read_records(out)) == 8
    before = out.read_bytes()
    # the retry, killed once its journal holds an answer
    journal = Path(journal_path(str(out)))
    proc = subprocess.Popen([sys.executable, "-m", "llamabatch", "run", *args, "--resume", "--retry-failed"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=bundled_env())
    try:
        got = wait_for_lines(journal, 1, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert got < 8, "the retry finished before it could be killed"
    assert out.read_bytes() == before  # OUTPUT untouched: every id still has its one record
    assert journal.exists()
    # the next retry merges what the killed one answered, then retries the rest
    final = real_run(*args, "--resume", "--retry-failed")
    assert final.returncode == 0, final.stderr
    assert "finished an interrupted --retry-failed" in final.stderr
    records = read_records(out)
    assert sorted(r["id"] for r in records) == sorted(line["id"] for line in lines) and len(records) == 8
    assert all(r["error"] is None and r["usage"]["completion_tokens"] == 8 for r in records)
    assert not journal.exists()
    m = read_manifest(manifest_path(str(out)))
    assert [h["event"] for h in m["history"]] == ["start", "retry-failed", "retry-failed"]
    assert m["status"] == "finished" and m["counts"]["error_code"] == {}


def test_json_without_dry_run_is_a_usage_error(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    proc = llamabatch_run(str(inp), *FAST, "--json")
    assert proc.returncode == 2 and "--json goes with --dry-run" in proc.stderr


def test_dry_run_resume_refuses_a_fifo_without_opening_it(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    proc = llamabatch_run(str(inp), "-o", str(fifo), *FAST, "--dry-run", "--resume")
    assert proc.returncode == 2 and "FIFO" in proc.stderr


def test_a_resume_reports_records_that_answer_no_input_line(tmp_path):
    inp, out = first_run(tmp_path)
    with out.open("a") as f:
        f.write(json.dumps({"id": "stray", "text": "x", "finish_reason": "stop", "usage": None, "timings": None,
                            "seed": 1, "error": None}) + "\n")
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert '1 record(s) in ' in proc.stderr and 'answer no INPUT line (ids "stray")' in proc.stderr
    assert read_manifest(manifest_path(str(out)))["not_in_input"] == 1
    assert len(read_records(out)) == 4  # reported, not removed: the file is the user's


def test_no_record_is_written_when_the_manifest_cannot_be(tmp_path, monkeypatch):
    from llamabatch.jobs.resume import resumable_output

    def full(path, manifest):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(resumable_output, "write_manifest", full)
    inp = write_lines(tmp_path / "in.jsonl", LINES)
    out = tmp_path / "out.jsonl"
    proc = llamabatch_run(str(inp), "-o", str(out), *FAST)
    assert proc.returncode == 1
    assert "cannot write the manifest" in proc.stderr and "No space left on device; nothing was run" in proc.stderr
    assert out.read_text() == ""
    assert not (tmp_path / "out.jsonl.lock").exists()
