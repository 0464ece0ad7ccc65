"""Every `llamabatch ...` command shown in README.md and docs/*.md parses.

The commands are parsed, not run: click's `make_context` builds each command's context (option
names, value types, choices, required arguments) without invoking it, so no model loads. A
command that no longer parses — a renamed flag, a dropped choice — fails with the file and
line it is written on.

What counts as a command: in ```console blocks, the lines after a `$ ` prompt; in ```bash,
```sh, ```zsh and ```fish blocks, every line. Backslash continuations are joined. A line is
split into simple commands at pipes, `&&`, `||` and `;`; redirections (`2>/dev/null`, `<&-`,
`> out.jsonl`), leading `VAR=value` assignments and comments are dropped, and the simple
commands that start with `llamabatch` (or `python -m llamabatch`) are parsed. Output lines,
python/json/toml blocks and inline code are not commands.
"""
from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.exceptions import TyperException  # Typer's own click: usage errors derive from it

from llamabatch.cli.app import app
from llamabatch.cli.run.ray_flag import with_bare_ray_flag

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "zsh", "fish"}
CONSOLE_BLOCKS = {"console", "shell-session"}
SEPARATORS = {"|", "||", "&&", ";", "&", "|&"}
FENCE = re.compile(r"^\s*```(\S*)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command line) of every command in the text's shell and console blocks."""
    found: list[tuple[int, str]] = []
    lang: str | None = None  # None: outside a fenced block
    pending: tuple[int, str] | None = None  # a line ending in a backslash, waiting for the rest
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = fence.group(1).lower() if lang is None else None
            pending = None
            continue
        if lang is None:
            continue
        if pending is not None:
            start, head = pending
            command = head + " " + line.strip()
        elif lang in CONSOLE_BLOCKS and line.lstrip().startswith("$ "):
            start, command = number, line.lstrip()[2:]
        elif lang in SHELL_BLOCKS:
            start, command = number, line.strip()
        else:
            continue
        if command.endswith("\\"):
            pending = (start, command[:-1])
            continue
        pending = None
        found.append((start, command))
    return found


def llamabatch_invocations(command: str) -> list[list[str]]:
    """The argument lists of the `llamabatch` commands in one shell line (pipes, redirections
    and assignments taken off)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: not a shell line this test can read
        return []
    simple: list[list[str]] = [[]]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in SEPARATORS:
            simple.append([])
        elif token[:1] in ("<", ">"):  # a redirection and its target
            i += 1
        elif token.isdigit() and i + 1 < len(tokens) and tokens[i + 1][:1] in ("<", ">"):
            pass  # the file descriptor of the redirection that follows
        else:
            simple[-1].append(token)
        i += 1
    invocations = []
    for words in simple:
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words[:1] == ["llamabatch"]:
            invocations.append(words[1:])
        elif len(words) >= 3 and words[1:3] == ["-m", "llamabatch"] and words[0].startswith("python"):
            invocations.append(words[3:])
    return invocations


@functools.lru_cache(maxsize=1)
def click_command():
    """The app as click sees it (Typer builds it on each call: about 0.1 s, so once)."""
    return typer.main.get_command(app)


def parse(args: list[str]) -> None:
    """Parse a command line the way `llamabatch` does, down to the subcommand, without
    invoking anything; raises Typer's usage errors (TyperException)."""
    command = click_command()
    ctx = command.make_context("llamabatch", with_bare_ray_flag(list(args)))
    while hasattr(command, "resolve_command"):  # a group: `config show` goes one level down
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None, f"no command {rest[0]!r}"
        command = sub
        ctx = command.make_context(name, list(rest), parent=ctx)


def documented_commands() -> list[tuple[str, list[str]]]:
    out = []
    for path in DOCS:
        for number, line in shell_lines(path.read_text(encoding="utf-8")):
            for args in llamabatch_invocations(line):
                out.append((f"{path.relative_to(ROOT)}:{number}", args))
    return out


COMMANDS = documented_commands()


def test_the_docs_show_commands_of_every_kind():
    # The extraction itself is checked: a regression in it would otherwise pass vacuously.
    assert len(COMMANDS) >= 30, COMMANDS
    shown = {args[0] for _, args in COMMANDS if args and not args[0].startswith("-")}
    assert {"run", "serve-stdin", "chat", "bench", "models", "config"} <= shown


def test_every_documented_command_parses():
    # One test for all of them (a few hundred parametrized cases cost the suite more in pytest's
    # overhead than in parsing); the failure lists every command that does not parse, by file:line.
    failures = []
    for where, args in COMMANDS:
        try:
            parse(args)
        except typer.Exit:  # --help or --version: parsed, and it would print and exit
            pass
        except TyperException as exc:
            failures.append(f"{where}: `llamabatch {shlex.join(args)}` does not parse: {exc.format_message()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("args", [["run", "x.jsonl", "--no-such-flag"], ["run", "x.jsonl", "--order", "sideways"],
                                  ["bench", "--pp", "ten"], ["no-such-command"], ["config", "show", "--command"]])
def test_a_command_that_does_not_parse_is_caught(args):
    with pytest.raises(TyperException):
        parse(args)


def test_shell_syntax_is_taken_off():
    line = "echo '{\"id\": 1}' | LLAMABATCH_TOP_P=0.9 llamabatch run - --n-parallel 2 2>/dev/null <&- > out.jsonl # note"
    assert llamabatch_invocations(line) == [["run", "-", "--n-parallel", "2"]]
    assert llamabatch_invocations("cd /tmp && llamabatch config path") == [["config", "path"]]
    assert llamabatch_invocations("python -m llamabatch models --json | head -2") == [["models", "--json"]]
    text = "```console\n$ llamabatch chat \\\n  --list\nID  WHEN\n```\n```python\nllamabatch run x\n```\n"
    assert shell_lines(text) == [(2, "llamabatch chat  --list")]
