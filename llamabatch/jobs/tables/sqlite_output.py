"""Whether a SQLite OUTPUT may be replaced: the table is written to a new file renamed over
OUTPUT when the run ends (table_output.py), which destroys whatever else the old file held.
So only what llamabatch wrote is replaced: no file, an empty one, or a database holding
nothing but an earlier run's `results` table (and its index). Anything else, another
program's tables or a file that is no database at all, is refused before the run and checked
again just before the rename. Adding `results` into someone's database instead would mean
writing in place into a file llamabatch does not own, and a `results` table there may be
theirs; sqlite's ATTACH reads llamabatch's file beside it just as well."""
from __future__ import annotations

import os
import sqlite3
from urllib.parse import quote

from .table_layout import RESULT_COLUMNS

SQLITE_HEADER = b"SQLite format 3\x00"
OWN_INDEX = "results_row"


class NotOurDatabase(Exception):
    """OUTPUT holds something llamabatch did not write; the message says what, in one line."""


def _own_results(db: sqlite3.Connection) -> bool:
    """Whether the database's `results` table has a results table's columns (one of ours)."""
    columns = {row[1] for row in db.execute('PRAGMA table_info("results")')}
    return set(RESULT_COLUMNS) <= columns


def foreign_content(path: str) -> str | None:
    """What in `path` llamabatch did not write (None: nothing, so it may be replaced)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except OSError:
        return None  # unreadable: writing the table says why, keeping the records
    if not head:
        return None  # an empty file (`touch out.db`): nothing to lose
    if head != SQLITE_HEADER:
        return "is not an SQLite database"
    try:
        db = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return f"is an SQLite database that cannot be read ({exc})"
    try:
        objects = db.execute("SELECT type, name FROM sqlite_master").fetchall()
        others = sorted(name for kind, name in objects
                        if not name.startswith("sqlite_")  # SQLite's own (ANALYZE statistics, ...)
                        and (kind, name) not in (("table", "results"), ("index", OWN_INDEX)))
        if ("table", "results") in objects and not _own_results(db):
            others.insert(0, "results (not a llamabatch results table)")
    except sqlite3.Error as exc:
        return f"is an SQLite database that cannot be read ({exc})"
    finally:
        db.close()
    if others:
        return f"holds what llamabatch did not write: {', '.join(others)}"
    return None


def refuse_foreign(path: str) -> None:
    """Raise NotOurDatabase when replacing `path` would destroy what llamabatch did not write."""
    why = foreign_content(path)
    if why is not None:
        raise NotOurDatabase(f"OUTPUT {path} {why}; a SQLite OUTPUT is replaced whole by the results table, so "
                             "write it to a new file (sqlite's ATTACH reads it beside yours)")
