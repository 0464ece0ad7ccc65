"""conftest.py hands the modules that mostly wait on real processes to xdist first; a name there
that no longer matches a module would lose that order without a word."""
from __future__ import annotations

from pathlib import Path

from conftest import WAITING_MODULES


def test_every_waiting_module_named_first_exists():
    here = Path(__file__).parent
    assert sorted(name for name in WAITING_MODULES if not (here / name).is_file()) == []
