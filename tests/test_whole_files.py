"""Files the command line reads whole: a grammar, a JSON schema, a prompt template.
Each is read through llamabatch.files.whole_file: at most a bounded number of bytes (a device or a
huge file never fills memory), decoded as UTF-8 and parsed as JSON with every failure one
line naming the flag and the file, exit 2. No model is loaded."""
from __future__ import annotations

import os

import pytest

from cli_harness import invoke
from llamabatch.files import whole_file
from llamabatch.settings.layers import merge
from llamabatch.files.whole_file import MAX_WHOLE_FILE_BYTES, UnreadableFile, read_bytes, read_json, read_text


@pytest.fixture(autouse=True)
def sandbox(settings_sandbox):
    return settings_sandbox  # conftest.py: no outside LLAMABATCH_*, cwd in a fresh folder


def one_error_line(result, *parts: str) -> str:
    """The command's stderr is exactly one `llamabatch: error:` line holding every part; exit 2."""
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("llamabatch: error: "), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def sparse_file(path, size: int):
    """A file of `size` bytes that takes no disk (a hole): large without the cost."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# -- D5: --grammar-file and --json-schema -----------------------------------------------------


@pytest.mark.parametrize("flag", ["--grammar-file", "--json-schema"])
def test_a_file_that_is_not_utf8_is_one_line(sandbox, flag):
    bad = sandbox / "bad.txt"
    bad.write_bytes(b'root ::= "\x00\xff"\n')
    result = invoke(["config", "show", flag, str(bad)])
    one_error_line(result, flag, str(bad), "not UTF-8 text")


@pytest.mark.parametrize("flag", ["--grammar-file", "--json-schema"])
def test_a_file_larger_than_the_bound_is_refused_unread(sandbox, flag):
    big = sparse_file(sandbox / "big.gbnf", MAX_WHOLE_FILE_BYTES + 1)
    result = invoke(["config", "show", flag, str(big)])
    one_error_line(result, flag, str(big), "larger than 64 MiB")


def test_a_device_that_never_ends_is_read_only_up_to_the_bound():
    # /dev/zero once read 24 GB, until the OOM killer ended it (and other processes)
    result = invoke(["config", "show", "--grammar-file", "/dev/zero"])
    one_error_line(result, "--grammar-file /dev/zero: larger than 64 MiB")


def test_a_schema_file_too_deep_or_not_an_object_is_one_line(sandbox):
    deep = sandbox / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    one_error_line(invoke(["config", "show", "--json-schema", str(deep)]), "--json-schema", "not valid JSON",
                   "deeper than")
    listed = sandbox / "list.json"
    listed.write_text("[1, 2]")
    one_error_line(invoke(["config", "show", "--json-schema", str(listed)]), "--json-schema must be a JSON object")
    # inline too: a deep schema given as the flag's value
    one_error_line(invoke(["config", "show", "--json-schema", "{" + '"a":[' * 50_000]),
                   "--json-schema is not valid JSON")


def test_good_grammar_and_schema_files_still_read(sandbox):
    grammar = sandbox / "g.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n', encoding="utf-8")
    schema = sandbox / "s.json"
    schema.write_text('{"type": "object",\n "required": ["é"]}', encoding="utf-8")
    assert merge({"grammar_file": str(grammar)}).sampling.grammar == 'root ::= "yes" | "no"\n'
    assert merge({"json_schema": str(schema)}).sampling.json_schema == {"type": "object", "required": ["é"]}
    result = invoke(["config", "show", "--json", "--grammar-file", str(grammar)])
    assert result.exit_code == 0, result.stderr


# -- the shared reader ------------------------------------------------------------------------


def test_the_reader_names_the_file_and_what_it_is(tmp_path):
    with pytest.raises(UnreadableFile) as info:
        read_text(str(tmp_path / "nope"), "--template-file")
    assert info.value.kind == whole_file.MISSING
    assert str(info.value) == f"--template-file {tmp_path / 'nope'}: No such file or directory"
    with pytest.raises(UnreadableFile) as info:
        read_text(str(tmp_path), "--template-file")
    assert info.value.kind == whole_file.UNREADABLE and "Is a directory" in str(info.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(UnreadableFile) as info:
        read_json(str(bad), "the manifest")
    assert info.value.kind == whole_file.NOT_JSON and "at line 3 column 3" in str(info.value)


def test_the_reader_reads_at_most_the_bound(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_bytes(str(path), "f", limit=10) == b"x" * 10
    with pytest.raises(UnreadableFile, match="larger than 9 bytes") as info:
        read_bytes(str(path), "f", limit=9)
    assert info.value.kind == whole_file.TOO_LARGE


def test_the_reader_reads_a_pipe_up_to_the_bound(tmp_path):
    # `--grammar-file <(make-grammar)` is a pipe: read, but never past the bound
    read_end, write_end = os.pipe()
    os.write(write_end, b'root ::= "a"')
    os.close(write_end)
    try:
        assert read_text(f"/dev/fd/{read_end}", "--grammar-file") == 'root ::= "a"'
    finally:
        os.close(read_end)


# -- the other files read whole ----------------------------------------------------------------


def test_bench_prompts_from_a_device_that_never_ends_is_one_line():
    # read line by line, /dev/zero was one line that never ended
    from llamabatch.bench.benchkit import read_prompt_file
    from llamabatch.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="^--prompts /dev/zero: larger than 64 MiB"):
        read_prompt_file("/dev/zero")


def test_bench_prompts_keep_their_line_ends(tmp_path):
    from llamabatch.bench.benchkit import read_prompt_file

    path = tmp_path / "p.txt"
    path.write_bytes("one\r\ntwo\rthree\x0bstill three\n\nfour".encode())
    assert read_prompt_file(str(path)) == [(1, "one"), (2, "two"), (3, "three\x0bstill three"), (5, "four")]


def test_a_config_file_nested_past_the_parser_is_one_line(sandbox):
    (sandbox / "llamabatch.toml").write_text("stop = " + "[" * 5000 + "]" * 5000 + "\n")
    one_error_line(invoke(["config", "show"]), "llamabatch.toml: invalid TOML: arrays or tables nested too deep")
