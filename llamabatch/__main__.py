"""`python -m llamabatch` is the same as the `llamabatch` command."""
from .cli.app import main

raise SystemExit(main())
