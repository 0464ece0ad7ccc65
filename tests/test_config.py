"""The config file: where it is found, precedence (default < file < env < flag), per-command
tables, every error case (one line with file and key, exit 2), `config show` and
`config path`. No model is loaded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llamabatch import InvalidRequest
from llamabatch.cli.app import app
from llamabatch.settings.file_layer import command_setting, command_setting_source, file_values_for, resolve_settings
from llamabatch.cli.engine_options import ENGINE_OPTIONS
from llamabatch.settings.config_file import ConfigFileError, key_lines, parse_text

from cli_harness import invoke


@pytest.fixture(autouse=True)
def clean_env(settings_sandbox):
    return settings_sandbox  # conftest.py: no outside LLAMABATCH_*, an empty config dir, cwd in tmp


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def show(*args: str, command: str | None = None, config: str | None = None) -> dict:
    """`[--config FILE] config show --json ARGS [--command C]` -> {key: (value, source)}."""
    argv = (["--config", config] if config else []) + ["config", "show", "--json", *args]
    result = invoke(argv + (["--command", command] if command else []))
    assert result.exit_code == 0, result.stderr
    settings = json.loads(result.stdout)["settings"]
    return {key: (entry["value"], entry["source"]) for key, entry in settings.items()}


LOCAL = """
# a comment, so keys are not on line 1
model = "models/tiny.gguf"
n_parallel = 4
policy = "balanced"

[sampling]
temperature = 0.2
top_k = 20
presence_penalty = 0.5

[run]
n_parallel = 16
temperature = 0.9
order = "completion"
"""


# --- precedence ----------------------------------------------------------------------

def test_default_when_no_file_env_or_flag():
    values = show()
    assert values["n_parallel"] == (8, "default")
    assert values["temperature"] == (0.8, "default")
    assert values["cache_prompt"] == (True, "default")


def test_chat_defaults_to_one_slot_below_every_other_layer(clean_env, monkeypatch):
    assert show(command="chat")["n_parallel"] == (1, "default (chat)")
    assert show(command="run")["n_parallel"] == ("auto", "default (run)")  # measured at start (autoslots)
    write(clean_env / "llamabatch.toml", "n_parallel = 3\n")
    assert show(command="chat")["n_parallel"] == (3, f"{clean_env / 'llamabatch.toml'}:1")
    monkeypatch.setenv("LLAMABATCH_N_PARALLEL", "2")
    assert show(command="chat")["n_parallel"] == (2, "env LLAMABATCH_N_PARALLEL")
    assert show("--n-parallel", "5", command="chat")["n_parallel"] == (5, "flag")
    write(clean_env / "llamabatch.toml", "n_parallel = \"auto\"\n")
    monkeypatch.delenv("LLAMABATCH_N_PARALLEL")
    assert show(command="chat")["n_parallel"] == ("auto", f"{clean_env / 'llamabatch.toml'}:1")


def test_serve_shares_one_kv_cache_by_default_unless_told_or_deterministic(clean_env, monkeypatch):
    assert show(command="serve")["kv_unified"] == (True, "default (serve)")
    for command in ("run", "serve-stdin", "chat"):  # the others keep a stream per slot
        assert show(command=command)["kv_unified"] == (False, "default")
    assert show("--no-kv-unified", command="serve")["kv_unified"] == (False, "flag")
    # deterministic mode needs a stream per slot: serve's default gives way instead of refusing
    assert show("--deterministic", command="serve")["kv_unified"] == (False, "default")
    write(clean_env / "llamabatch.toml", "[serve]\nkv_unified = false\n")
    assert show(command="serve")["kv_unified"] == (False, f"{clean_env / 'llamabatch.toml'}:2")
    monkeypatch.setenv("LLAMABATCH_KV_UNIFIED", "1")
    assert show(command="serve")["kv_unified"] == (True, "env LLAMABATCH_KV_UNIFIED")


def test_file_overrides_default_with_file_and_line(clean_env):
    path = write(clean_env / "llamabatch.toml", LOCAL)
    values = show()
    assert values["n_parallel"] == (4, f"{path}:3")
    assert values["policy"] == ("balanced", f"{path}:4")
    assert values["temperature"] == (0.2, f"{path}:7")
    assert values["top_k"] == (20, f"{path}:8")
    assert values["n_batch"] == (512, "default")
    # relative paths in the file are relative to the file's folder
    assert values["model"] == (str(clean_env / "models" / "tiny.gguf"), f"{path}:2")


def test_env_overrides_file(clean_env, monkeypatch):
    write(clean_env / "llamabatch.toml", LOCAL)
    monkeypatch.setenv("LLAMABATCH_N_PARALLEL", "6")
    monkeypatch.setenv("LLAMABATCH_TEMPERATURE", "0.5")
    values = show()
    assert values["n_parallel"] == (6, "env LLAMABATCH_N_PARALLEL")
    assert values["temperature"] == (0.5, "env LLAMABATCH_TEMPERATURE")


def test_flag_overrides_env_and_file(clean_env, monkeypatch):
    write(clean_env / "llamabatch.toml", LOCAL)
    monkeypatch.setenv("LLAMABATCH_N_PARALLEL", "6")
    values = show("--n-parallel", "3", "--no-cache-prompt")
    assert values["n_parallel"] == (3, "flag")
    assert values["cache_prompt"] == (False, "flag")


def test_command_table_overrides_top_level_and_sampling(clean_env):
    path = write(clean_env / "llamabatch.toml", LOCAL)
    run = show(command="run")
    assert run["n_parallel"] == (16, f"{path}:12")
    assert run["temperature"] == (0.9, f"{path}:13")
    assert run["policy"] == ("balanced", f"{path}:4")  # not in [run]: the top level still applies
    assert run["order"] == ("completion", f"{path}:14")  # run's own key
    chat = show(command="chat")  # another command does not see [run]
    assert chat["n_parallel"] == (4, f"{path}:3")
    assert chat["temperature"] == (0.2, f"{path}:7")
    assert "order" not in chat


def test_env_and_flag_override_the_command_table(clean_env, monkeypatch):
    write(clean_env / "llamabatch.toml", LOCAL)
    monkeypatch.setenv("LLAMABATCH_N_PARALLEL", "6")
    assert show(command="run")["n_parallel"] == (6, "env LLAMABATCH_N_PARALLEL")
    assert show("--n-parallel", "2", command="run")["n_parallel"] == (2, "flag")


def test_resolve_options_uses_the_file_for_engine_and_sampling(clean_env):
    path = write(clean_env / "llamabatch.toml", LOCAL)
    write(clean_env / "json.gbnf", 'root ::= "{}"\n')
    with open(path, "a", encoding="utf-8") as f:
        f.write('\n[chat]\ngrammar_file = "json.gbnf"\nmax_tokens = 7\n')
    resolved = resolve_settings({}, "chat")
    assert resolved.engine.n_parallel == 4 and resolved.engine.policy == "balanced"
    assert resolved.sampling.temperature == 0.2 and resolved.sampling.max_tokens == 7
    assert resolved.sampling.presence_penalty == 0.5  # a sampling field with no flag of its own
    assert resolved.sampling.grammar == 'root ::= "{}"\n'  # read from next to the config file
    assert resolved.sources["presence_penalty"] == f"{path}:9"
    resolved = resolve_settings({"temperature": 0.0}, "run")
    assert resolved.sampling.temperature == 0.0 and resolved.engine.n_parallel == 16


def test_command_setting(clean_env):
    assert command_setting("run", "order", "input") == "input"  # no file
    path = write(clean_env / "llamabatch.toml", LOCAL)
    assert command_setting("run", "order", "input") == "completion"
    assert command_setting_source("run", "order") == f"{path}:14"
    assert command_setting("run", "max_inflight", 64) == 64  # declared, not set
    assert command_setting_source("run", "max_inflight") is None
    with pytest.raises(KeyError):
        command_setting("run", "ordr")  # undeclared keys are a programming error


def test_every_command_reads_its_own_table():
    """The name a command passes to the config layer is the name its table has."""
    from llamabatch.settings.config_file import COMMANDS

    named = {info.name: getattr(info.callback, "config_command", None) for info in app.registered_commands}
    assert {name: named.get(name) for name in COMMANDS} == {name: name for name in COMMANDS}


def test_file_values_for_unknown_command_sees_top_level_only(clean_env):
    path = write(clean_env / "llamabatch.toml", LOCAL)
    values = file_values_for("")
    assert values["n_parallel"] == (4, f"{path}:3")
    assert "order" not in values


def test_sampling_table_forms(clean_env):
    path = write(clean_env / "llamabatch.toml", """
        [sampling]
        stop = "END"
        json_schema = { type = "object", required = ["a"] }
        logit_bias = { "42" = -100 }
        """)
    values = show()
    assert values["stop"] == (["END"], f"{path}:2")
    assert json.loads(values["json_schema"][0]) == {"type": "object", "required": ["a"]}
    resolved = resolve_settings({}, "")
    assert resolved.sampling.json_schema == {"type": "object", "required": ["a"]}
    assert resolved.sampling.logit_bias == {42: -100.0}


# --- which file ----------------------------------------------------------------------

def path_of(*args: str, env: dict | None = None):
    return invoke([*args, "config", "path"], env=env)


def test_config_path_none(clean_env, tmp_path):
    result = path_of()
    assert result.exit_code == 1
    assert result.stdout == ""
    assert str(clean_env / "llamabatch.toml") in result.stderr
    assert str(tmp_path / "xdg" / "llamabatch" / "config.toml") in result.stderr


def test_config_path_user_file_then_local_file(clean_env, tmp_path):
    user = write(tmp_path / "xdg" / "llamabatch" / "config.toml", "n_parallel = 2\n")
    assert path_of().stdout.strip() == str(user)
    local = write(clean_env / "llamabatch.toml", "n_parallel = 3\n")
    assert path_of().stdout.strip() == str(local)  # ./llamabatch.toml wins
    assert show()["n_parallel"] == (3, f"{local}:1")


def test_config_path_home_default_without_xdg(clean_env, tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    user = write(tmp_path / "home" / ".config" / "llamabatch" / "config.toml", "n_parallel = 2\n")
    assert path_of().stdout.strip() == str(user)


def test_config_flag_and_env_beat_the_implicit_files(clean_env, tmp_path, monkeypatch):
    write(clean_env / "llamabatch.toml", "n_parallel = 3\n")
    from_env = write(tmp_path / "env.toml", "n_parallel = 5\n")
    from_flag = write(tmp_path / "flag.toml", "n_parallel = 7\n")
    monkeypatch.setenv("LLAMABATCH_CONFIG", str(from_env))
    assert path_of().stdout.strip() == str(from_env)
    assert show()["n_parallel"] == (5, f"{from_env}:1")
    assert path_of("--config", str(from_flag)).stdout.strip() == str(from_flag)
    assert show(config=str(from_flag))["n_parallel"] == (7, f"{from_flag}:1")


# --- errors: one line, file and key, exit 2 ----------------------------------------------

ERRORS = [
    # (file text, what the one line must contain besides the file)
    ('n_parallel = "eight"\n', [":1: n_parallel:", "an integer >= 1", '"eight"']),
    ("\n\nn_parallel = 0\n", [":3: n_parallel:", "an integer >= 1", "got 0"]),
    ('policy = "fastest"\n', [":1: policy:", "decode-maximal", "prefill-priority", "balanced", '"fastest"']),
    ("cache_prompt = 1\n", [":1: cache_prompt:", "true or false"]),
    ("n_gpu_layers = -2\n", [":1: n_gpu_layers:", ">= -1"]),
    ("colour = 1\n", [":1: colour: unknown key", "n_parallel"]),
    ("temperature = 0.1\n", [":1: temperature:", "[sampling]"]),
    ("[sampling]\nn_parallel = 2\n", [":2: [sampling] n_parallel:", "top level"]),
    ("[sampling]\ntop_p = 2\n", [":2: [sampling] top_p:", "(0, 1]"]),
    ("[sampling]\nmax_tokens = 1.5\n", [":2: [sampling] max_tokens:", "integer"]),
    ('[sampling]\ntemperature = "hot"\n', [":2: [sampling] temperature:", "number"]),
    ("[sampling]\nstop = [1]\n", [":2: [sampling] stop:", "list of strings"]),
    ("[sampling]\nbanana = 1\n", [":2: [sampling] banana: unknown key", "temperature"]),
    ("[run]\nbogus = 1\n", [":2: [run] bogus: unknown key", "order", "max_inflight"]),
    ('[run]\norder = "random"\n', [":2: [run] order:", '"input"', '"completion"']),
    ("[run]\nn_parallel = 0\n", [":2: [run] n_parallel:", ">= 1"]),
    ('[serve-stdin]\non_eof = "stop"\n', [":2: [serve-stdin] on_eof:", '"drain"', '"cancel"']),
    ("[chat]\norder = 'input'\n", [":2: [chat] order: unknown key"]),
    ("[server]\nx = 1\n", [":1: [server]: unknown table", "[serve-stdin]", "[serve]"]),
    ("sampling = 3\n", [":1: [sampling]: must be a table"]),
    ("n_parallel = \n", [": invalid TOML:", "line 1"]),
    ("[sampling\n", [": invalid TOML:", "line 1"]),
    ("n_parallel = 2\nn_parallel = 3\n", [": invalid TOML:", "line 2"]),
]


@pytest.mark.parametrize("text,expected", ERRORS, ids=[e[0].strip().replace("\n", " | ") for e in ERRORS])
def test_bad_file_is_one_line_with_file_and_key_exit_2(clean_env, text, expected):
    path = clean_env / "llamabatch.toml"
    path.write_text(text, encoding="utf-8")
    result = invoke(["config", "show"])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"llamabatch: error: {path}")
    for fragment in expected:
        assert fragment in lines[0]


def test_bad_file_also_stops_a_command_before_anything_runs(clean_env):
    write(clean_env / "llamabatch.toml", "n_parallel = 0\n")
    with pytest.raises(InvalidRequest) as info:  # what every command calls first; main() makes it exit 2
        resolve_settings({}, "run")
    assert ":1: n_parallel: must be an integer >= 1 or \"auto\", got 0" in str(info.value)
    assert invoke(["run", "-"], "hi\n").exit_code == 2


def test_missing_config_flag_file(clean_env):
    result = invoke(["--config", "nope.toml", "config", "show"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"llamabatch: error: config file {clean_env / 'nope.toml'} (from --config): no such file"]


def test_missing_config_env_file(clean_env, monkeypatch):
    monkeypatch.setenv("LLAMABATCH_CONFIG", str(clean_env / "gone.toml"))
    result = invoke(["config", "path"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"llamabatch: error: config file {clean_env / 'gone.toml'} (from $LLAMABATCH_CONFIG): no such file"]


def test_config_that_is_not_utf8(clean_env):
    (clean_env / "llamabatch.toml").write_bytes(b"model = \"\xff\"\n")
    result = invoke(["config", "show"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"llamabatch: error: {clean_env / 'llamabatch.toml'}: not UTF-8 text (byte 9)"]


def test_errors_in_a_real_process(clean_env):
    """The same line and exit code from the installed program, not only in-process."""
    path = write(clean_env / "llamabatch.toml", "[sampling]\nseed = -1\n")
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "config", "show"], capture_output=True, text=True,
                          cwd=clean_env, env=os.environ | {"XDG_CONFIG_HOME": str(clean_env)})
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"llamabatch: error: {path}:2: [sampling] seed: must be an integer in [0, 4294967295) "
        f"(4294967295 means 'random' to llama.cpp), got -1"]


# --- config show ---------------------------------------------------------------------

def test_config_show_table_names_every_source(clean_env, monkeypatch):
    path = write(clean_env / "llamabatch.toml", LOCAL)
    monkeypatch.setenv("LLAMABATCH_TOP_P", "0.5")
    result = invoke(["config", "show", "--command", "run", "--max-tokens", "12"])
    assert result.exit_code == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert rows["KEY"] == ["KEY", "VALUE", "SOURCE"]
    assert rows["max_tokens"] == ["max_tokens", "12", "flag"]
    assert rows["top_p"] == ["top_p", "0.5", "env", "LLAMABATCH_TOP_P"]
    assert rows["n_parallel"] == ["n_parallel", "16", f"{path}:12"]
    assert rows["top_k"] == ["top_k", "20", f"{path}:8"]
    assert rows["n_batch"] == ["n_batch", "512", "default"]
    assert rows["order"] == ["order", "completion", f"{path}:14"]
    assert set(ENGINE_OPTIONS) <= set(rows)  # every shared setting is listed
    assert f"config file: {path} (from current directory)" in result.stderr


def test_config_show_without_a_file_says_so(clean_env):
    result = invoke(["config", "show"])
    assert result.exit_code == 0
    assert "config file: none" in result.stderr
    assert all(line.split()[-1] in ("default", "SOURCE") for line in result.stdout.splitlines())


def test_config_show_rejects_an_unknown_command():
    result = invoke(["config", "show", "--command", "server"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "llamabatch: error: --command must be one of run, chat, serve-stdin, serve, bench, got 'server'"]


def test_config_show_reports_a_bad_env_value():
    result = invoke(["config", "show"], env={"LLAMABATCH_N_PARALLEL": "many"})
    assert result.exit_code == 2
    assert "LLAMABATCH_N_PARALLEL" in result.stderr and len(result.stderr.splitlines()) == 1


# --- line numbers without tomllib's help ---------------------------------------------------

def test_key_lines_skip_multiline_strings_and_follow_dotted_and_quoted_keys():
    text = textwrap.dedent('''\
        n_parallel = 2
        chat.top_k = 5
        [sampling]
        grammar = """
        root = "not a key"
        temperature = 9
        """
        "temperature" = 0.3
        [ "run" ]
        max_tokens = 8   # comment
        ''')
    lines = key_lines(text)
    assert lines[("n_parallel",)] == 1
    assert lines[("chat", "top_k")] == 2
    assert lines[("sampling", "grammar")] == 4
    assert ("sampling", "root") not in lines
    assert lines[("sampling", "temperature")] == 8
    assert lines[("run",)] == 9
    assert lines[("run", "max_tokens")] == 10
    config = parse_text(text, "x.toml")
    assert config.sampling["grammar"].value.startswith('root = "not a key"')
    assert config.sampling["temperature"].line == 8
    assert config.commands["chat"]["top_k"].line == 2


def test_an_error_inside_an_inline_table_points_at_its_line():
    with pytest.raises(ConfigFileError) as info:
        parse_text('n_parallel = 1\nrun = { order = "sideways" }\n', "x.toml")
    assert str(info.value).startswith("x.toml:2: [run] order: must be one of")


def test_a_clash_between_file_values_names_where_the_file_sets_it(clean_env):
    path = write(clean_env / "llamabatch.toml", "n_parallel = 8\n[run]\nn_batch = 4\n")
    result = invoke(["config", "show", "--command", "run"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"llamabatch: error: {path}:3: n_batch must be an integer >= n_parallel (8), got 4"]
    assert invoke(["config", "show", "--command", "chat"]).exit_code == 0  # [run] only


# --- [models]: aliases for --model ----------------------------------------------------


def test_models_table_holds_aliases_with_paths_relative_to_the_file(clean_env):
    config = parse_text(textwrap.dedent("""
        model = "fast"
        [models]
        fast = "ollama:gemma3:1b"
        mine = "weights/my.gguf"
        hub = "hf:acme/tiny-GGUF:Q8_0"
        """), str(clean_env / "llamabatch.toml"))
    assert {k: s.value for k, s in config.models.items()} == {
        "fast": "ollama:gemma3:1b", "mine": str(clean_env / "weights" / "my.gguf"), "hub": "hf:acme/tiny-GGUF:Q8_0"}
    assert config.models["mine"].line == 5
    assert config.engine["model"].value == "fast"  # an alias stays a name, not a path beside the file


def test_an_alias_becomes_the_model_and_its_display_name(clean_env, model_path):
    write(clean_env / "llamabatch.toml", f'model = "small"\n[models]\nsmall = "{model_path}"\n')
    resolved = resolve_settings({}, "run")
    assert resolved.engine.model == model_path
    assert resolved.engine.model_name == "small"


@pytest.mark.parametrize("text, fragment", [
    ('[models]\nfast = 3\n', "[models] fast: must be a model"),
    ('[models]\nfast = ""\n', "[models] fast: must be a model"),
    ('models = "x"\n', "[models]: must be a table"),
])
def test_bad_models_table_is_one_line(clean_env, text, fragment):
    with pytest.raises(ConfigFileError) as info:
        parse_text(text, str(clean_env / "c.toml"))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
