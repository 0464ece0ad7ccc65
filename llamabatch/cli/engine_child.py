"""`python -m llamabatch.cli.engine_child`: the supervised engine's child process.

supervised/child.py does the work (`serve_parent`); this entry only turns its outcome into the
process's exit status, as the CLI does for every command: 0 served (or the parent was gone
before it started), 1 the engine did not load.
"""
from __future__ import annotations

import sys

from ..supervised.child import ParentGone, serve_parent


def main() -> int:
    try:
        return serve_parent()
    except ParentGone:
        return 0


if __name__ == "__main__":
    sys.exit(main())
