"""The id sets behind duplicate detection and --resume, without a model."""
from __future__ import annotations

from llamabatch.jobs.resume.id_sets import Answered, IdSet


def test_idset_adds_each_id_once_and_grows():
    ids = IdSet(capacity=4)
    assert all(ids.add(f"id-{i}") for i in range(5000))
    assert len(ids) == 5000
    assert not any(ids.add(f"id-{i}") for i in range(5000))
    assert "id-4999" in ids and "id-5000" not in ids


def test_idset_keeps_number_and_string_ids_apart():
    ids = IdSet()
    assert ids.add(5) and ids.add("5")
    assert 5 in ids and "5" in ids and 6 not in ids


def test_row_numbers_from_one_are_a_counter_and_stay_exact_sets():
    ids = IdSet(capacity=4)
    assert all(ids.add(i) for i in range(1, 100_001))
    assert len(ids) == 100_000 and len(ids._slots) == 8  # no fingerprint was stored
    assert not ids.add(1) and not ids.add(100_000) and 100_000 in ids and 100_001 not in ids
    # out of order and other kinds of id still go by fingerprint, and mix with the counter
    assert ids.add(100_003) and ids.add(100_001) and ids.add(100_002)
    assert not ids.add(100_003) and ids.add(100_004)
    assert True not in ids and ids.add(True) and ids.add("1") and ids.add(0) and ids.add(-1)
    assert len(ids) == 100_004 + 4
    assert all(i in ids for i in (1, 100_002, 100_004, True, "1", 0, -1)) and 100_005 not in ids


def test_answered_counts_duplicate_records_apart():
    answered = Answered()
    answered.add("a", "duplicate_id")  # a later "a" line's error was written, the first "a" wasn't
    answered.add("b", None)
    assert answered.records == 2
    assert not answered.covers("a", first_use=True)  # the first "a" still needs its answer
    assert answered.covers("a", first_use=False)  # the duplicate's error is already there
    assert not answered.covers("a", first_use=False)  # a third "a" gets its own error
    assert answered.covers("b", first_use=True)
