"""Every command's --help renders, with the typer and rich that this install resolved.

Help texts go through rich markup (rich_markup_mode="rich"), where a bracketed spelling such as
`NAME[/CONFIG]` reads as a closing tag: `llamabatch run --help` once exited 1 with rich's
MarkupError. The command tree is walked from the app itself, so a command added
later is covered without touching this file.
"""
from __future__ import annotations

import pytest
from importlib.metadata import version

from typer.main import get_command

from llamabatch.cli.app import app
from typer.testing import CliRunner


def command_paths(command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    # by duck typing: typer 0.29 carries a click of its own (typer._click), not click's classes
    paths = [path]
    if getattr(command, "commands", None):
        for name, sub in sorted(command.commands.items()):
            paths += command_paths(sub, (*path, name))
    return paths


PATHS = command_paths(get_command(app))


def show_help(args: list[str]):
    # Typer's own runner: the page goes through rich's console as in a terminal, wide enough
    # that no spelling is wrapped
    return CliRunner().invoke(app, args, env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


def test_the_walk_finds_every_command_and_subcommand():
    names = {" ".join(p) for p in PATHS}
    assert {"", "run", "report", "serve-stdin", "chat", "bench", "models", "config", "config show"} <= names


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "llamabatch")
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_renders(path, flag):
    result = show_help([*path, flag])
    versions = f"typer {version('typer')}, rich {version('rich')}"
    assert result.exit_code == 0, f"llamabatch {' '.join(path)} {flag} ({versions}): {result.exception!r}"
    assert "Usage: " in result.stdout
    # the docstring's first line and every option reach the page
    assert "--help" in result.stdout


def test_bracketed_spellings_read_as_written():
    # what rich would have eaten as tags is shown literally
    page = show_help(["run", "--help"]).stdout
    flat = " ".join(page.replace("│", " ").split())
    assert "hf:datasets/OWNER/NAME[/CONFIG][:SPLIT]" in flat, page


def help_texts(command) -> list[tuple[str, str]]:
    texts = [("help", command.help), ("epilog", command.epilog)]
    texts += [(getattr(p, "opts", [p.name])[0], getattr(p, "help", None)) for p in command.params]
    return [(where, text) for where, text in texts if text]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "llamabatch")
def test_no_help_text_loses_a_bracket_to_rich_markup(path):
    # rich drops a tag it cannot style without a word: `[default: x]` in an option's help would
    # vanish from the page. Markup meant as markup is not used in help texts; `\[` shows a `[`.
    from rich.errors import MarkupError
    from rich.markup import render

    command = get_command(app)
    for name in path:
        command = command.commands[name]
    lost = []
    for where, text in help_texts(command):
        try:
            shown = render(text).plain
        except MarkupError as exc:
            lost.append(f"{where}: {exc}")
            continue
        if shown != text.replace("\\[", "["):
            lost.append(f"{where}: {text!r} renders as {shown!r}")
    assert not lost, f"llamabatch {' '.join(path)}:\n" + "\n".join(lost)
