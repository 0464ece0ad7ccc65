"""The id sets behind duplicate detection and --resume, without a model."""
from __future__ import annotations

from llamabatch.cli.run.ids import Answered, IdSet


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


def test_answered_counts_duplicate_records_apart():
    answered = Answered()
    answered.add("a", "duplicate_id")  # a later "a" line's error was written, the first "a" wasn't
    answered.add("b", None)
    assert answered.records == 2
    assert not answered.covers("a", first_use=True)  # the first "a" still needs its answer
    assert answered.covers("a", first_use=False)  # the duplicate's error is already there
    assert not answered.covers("a", first_use=False)  # a third "a" gets its own error
    assert answered.covers("b", first_use=True)
