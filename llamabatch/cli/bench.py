"""`llamabatch bench`."""
from __future__ import annotations

from .app import app
from .common import EXIT_USAGE, say
from .options import SharedOptions, with_shared_options

import typer


@app.command("bench")
@with_shared_options
def bench_command(opts: SharedOptions) -> None:
    """Not yet available."""
    say("llamabatch bench: not yet available")
    raise typer.Exit(EXIT_USAGE)
