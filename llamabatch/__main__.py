"""`python -m llamabatch` is the same as the `llamabatch` command; `python -m llamabatch
--process NAME` runs one of the processes llamabatch starts of itself (processes/entries.py)."""
import sys

from .processes.entries import PROCESS_FLAG

if sys.argv[1:2] == [PROCESS_FLAG]:
    from .cli.process_entries import run_entry

    raise SystemExit(run_entry(sys.argv[2:]))

from .cli.app import main  # noqa: E402

raise SystemExit(main())
