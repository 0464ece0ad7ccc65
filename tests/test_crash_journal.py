"""The poison-line rule across process deaths (llamabatch/jobs/resume/crash_journal.py): what a resume
learns from the lines an earlier process started and never ended. A "death" here is a journal
left open: the next open with resume reads it as a crash with those lines in flight."""
from __future__ import annotations

import json
import os

from llamabatch.jobs.resume.crash_journal import CrashJournal, journal_path


def died_with(path: str, *line_ids) -> CrashJournal:
    """Resume, start `line_ids`, and die (no end, no close): the next open sees a crash."""
    journal = CrashJournal.open(path, resume=True)
    for line_id in line_ids:
        journal.started(line_id)
    journal._file.close()  # what a process death leaves: the lines written so far
    return journal


def test_lines_in_flight_at_a_crash_become_suspects_and_one_alone_at_its_second_is_poison(tmp_path):
    path = journal_path(str(tmp_path / "out.jsonl"))
    died_with(path, "a", "b", "c")
    after_one = CrashJournal.open(path, resume=True)
    assert [after_one.is_suspect(i) for i in "abcd"] == [True, True, True, False]
    assert not any(after_one.is_poisoned(i) for i in "abc")  # three in flight: nobody is blamed yet
    after_one._file.close()
    died_with(path, "b")  # alone, its second crash
    after_two = CrashJournal.open(path, resume=True)
    assert after_two.is_poisoned("b") and not after_two.is_suspect("b")
    assert after_two.is_suspect("a") and after_two.is_suspect("c") and not after_two.is_poisoned("a")


def test_one_crash_alone_is_not_enough_and_an_answer_clears_a_suspect(tmp_path):
    path = journal_path(str(tmp_path / "out.jsonl"))
    died_with(path, 7)
    journal = CrashJournal.open(path, resume=True)
    assert journal.is_suspect(7) and not journal.is_poisoned(7)  # a crash alone, once, may be bad luck
    journal.started(7)
    journal.ended(7, answered=True)
    journal.started(8)
    journal.ended(8, answered=False)  # cancelled by a clean stop: not a crash
    journal.close(complete=False)
    again = CrashJournal.open(path, resume=True)
    assert not again.is_suspect(7) and not again.is_suspect(8) and not again.is_poisoned(7)


def test_a_suspect_cancelled_by_a_clean_stop_stays_a_suspect(tmp_path):
    path = journal_path(str(tmp_path / "out.jsonl"))
    died_with(path, "x", "y")
    journal = CrashJournal.open(path, resume=True)
    journal.started("x")
    journal.ended("x", answered=False)
    journal.close(complete=False)
    assert CrashJournal.open(path, resume=True).is_suspect("x")


def test_ids_keep_their_json_type_and_a_torn_line_is_passed_over(tmp_path):
    path = journal_path(str(tmp_path / "out.jsonl"))
    died_with(path, 5)
    with open(path, "a") as f:
        f.write('{"start": "5"')  # torn by the death: no newline, no end
    journal = CrashJournal.open(path, resume=True)
    assert journal.is_suspect(5) and not journal.is_suspect("5")


def test_a_fresh_run_forgets_an_old_journal_and_a_complete_job_removes_it(tmp_path):
    path = journal_path(str(tmp_path / "out.jsonl"))
    died_with(path, "a")
    died_with(path, "a")
    fresh = CrashJournal.open(path, resume=False)
    assert not fresh.is_suspect("a") and not fresh.is_poisoned("a")
    fresh.close(complete=False)
    assert json.loads(open(path).readline()) == {"crashes": [], "poisoned": []}
    CrashJournal.open(path, resume=True).close(complete=True)
    assert not os.path.exists(path)
