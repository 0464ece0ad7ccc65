"""`run --ray [ADDRESS]`: a flag whose value is optional, which Typer has not."""
from __future__ import annotations

import re

# What --ray accepts as its optional ADDRESS; anything else after a bare --ray is the next argument.
_ADDRESS = re.compile(r"^(auto|local|ray://\S+|\[[0-9a-fA-F:]+\]:\d+|[\w.-]+:\d+)$")


def with_bare_ray_flag(argv: list[str]) -> list[str]:
    """Typer has no options with an optional value, so a bare `--ray` is spelled `--ray=local`
    here before parsing. `--ray ADDRESS` keeps its value only when it looks like an address
    (auto, HOST:PORT, ray://HOST:PORT), so `run --ray prompts.jsonl` still means the file."""
    if "--ray" not in argv:
        return list(argv)  # every command line passes here: the jobs package loads only for --ray
    from ...jobs.on_ray import LOCAL

    out = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + argv[i:]
        if arg == "--ray" and (i + 1 == len(argv) or not _ADDRESS.match(argv[i + 1])):
            out.append(f"--ray={LOCAL}")
        else:
            out.append(arg)
    return out
