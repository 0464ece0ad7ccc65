"""The committed completion scripts are what the generator writes, they call back into the
program (so new options need no regeneration), and bash completion really answers."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from llamabatch.cli.app import app
from llamabatch.cli.completions import COMPLETE_VAR, FILES, generate

COMMITTED = Path(__file__).resolve().parent.parent / "completions"


def console_script() -> str:
    """The installed `llamabatch` program: what the scripts call back."""
    found = shutil.which("llamabatch", path=str(Path(sys.executable).parent)) or shutil.which("llamabatch")
    assert found, "the llamabatch console script is not installed (pip install -e .)"
    return found


def complete_bash(words: list[str], cword: int) -> list[str]:
    env = os.environ | {COMPLETE_VAR: "complete_bash", "COMP_WORDS": " ".join(words), "COMP_CWORD": str(cword)}
    proc = subprocess.run([console_script()], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_committed_scripts_match_the_generator(tmp_path):
    written = generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(FILES.values())
    for path in written:
        committed = COMMITTED / path.name
        assert committed.exists(), f"{committed} missing: run python -m llamabatch.cli.completions"
        assert committed.read_text(encoding="utf-8") == path.read_text(encoding="utf-8"), (
            f"{committed} is stale: run python -m llamabatch.cli.completions")


def test_zsh_script_starts_with_compdef():
    # compinit only picks a file up from $fpath when its first line is `#compdef NAME`
    assert (COMMITTED / "_llamabatch").read_text(encoding="utf-8").startswith("#compdef llamabatch\n")


def _option_names(command: typer.core.click.Command) -> set[str]:
    names = {opt for param in command.params for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", [])}
    for sub in getattr(command, "commands", {}).values():
        names |= _option_names(sub)
    return names


def test_scripts_name_no_option_so_they_survive_option_changes():
    """The scripts ask the program for candidates at Tab time: no command's option is
    spelled in them, so adding or renaming options never makes them stale."""
    options = {name for name in _option_names(typer.main.get_command(app)) if name.startswith("--") and name != "--help"}
    assert "--n-parallel" in options and "--config" in options
    for name in FILES.values():
        text = (COMMITTED / name).read_text(encoding="utf-8")
        assert COMPLETE_VAR in text
        text = text.replace("complete --command llamabatch", "")  # fish's own `complete` flag, not ours
        assert not [opt for opt in options if opt in text], name


def test_bash_completes_commands():
    assert complete_bash(["llamabatch", "ru"], 1) == ["run"]
    offered = complete_bash(["llamabatch", ""], 1)
    assert {"run", "serve-stdin", "chat", "bench", "config"} <= set(offered)


def test_bash_completes_engine_options():
    offered = complete_bash(["llamabatch", "run", "--n-"], 2)
    assert {"--n-parallel", "--n-ctx", "--n-batch", "--n-gpu-layers"} <= set(offered)
    assert all(word.startswith("--n-") for word in offered)


def test_bash_completes_config_show_command_names():
    assert complete_bash(["llamabatch", "config", "show", "--command", "se"], 4) == ["serve-stdin", "serve"]
    assert complete_bash(["llamabatch", "config", "show", "--command", "b"], 4) == ["bench"]


def test_the_committed_bash_script_completes_in_bash():
    """Source the committed file in a real bash, as a user would, and press Tab."""
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the bash completion script"
    script = f"""
        source {COMMITTED / 'llamabatch.bash'}
        COMP_WORDS=(llamabatch run --n-par); COMP_CWORD=2
        _llamabatch_completion llamabatch
        printf '%s\\n' "${{COMPREPLY[@]}}"
    """
    env = os.environ | {"PATH": f"{Path(console_script()).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([bash, "--norc", "--noprofile", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["--n-parallel"]


def test_bash_completes_chat_options():
    offered = complete_bash(["llamabatch", "chat", "--re"], 2)
    assert {"--resume", "--repeat-penalty"} <= set(offered)
    assert {"--continue", "--list", "--search", "--load", "--no-save"} <= set(complete_bash(["llamabatch", "chat", "--"], 2))
