"""`llamabatch chat`."""
from __future__ import annotations

from .app import app
from .common import EXIT_USAGE, say
from .options import SharedOptions, with_shared_options

import typer


@app.command("chat")
@with_shared_options
def chat_command(opts: SharedOptions) -> None:
    """Not yet available."""
    say("llamabatch chat: not yet available")
    raise typer.Exit(EXIT_USAGE)
