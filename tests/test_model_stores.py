"""`--model` spellings and `llamabatch models`, over fake stores in a temp dir.

Every store entry is a symlink to the bundled model, and HOME, HF_HOME, LLAMA_CACHE and
OLLAMA_MODELS point into the temp dir, so nothing real is read or touched. Resolution tests
need no model; the `model`-marked ones load the bundled model through each spelling.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_tools import hf_repo, link, ollama_model
from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.models.model_list import list_models
from llamabatch.models.stores import ModelNotFound, resolve_spelling
from llamabatch.models.resolve import resolve_model_ref

SMALL = dict(n_parallel=1, n_ctx=256, n_batch=64)
GREEDY = SamplingParams(max_tokens=3, temperature=0)


@pytest.fixture()
def stores(tmp_path, monkeypatch, model_path):
    """Fake Hugging Face, llama.cpp, Ollama and LM Studio stores, plus two plain folders."""
    home = tmp_path / "home"
    env = {"HOME": str(home), "HF_HOME": str(tmp_path / "hf"), "LLAMA_CACHE": str(tmp_path / "llama.cpp"),
           "OLLAMA_MODELS": str(tmp_path / "ollama"),
           # the bundled model stays where it is assembled, whatever HOME says
           "LLAMABATCH_CACHE_DIR": str(Path(model_path).parent.parent)}
    for name in ("HF_HUB_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "LLAMABATCH_MODEL", "LLAMABATCH_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    hub = tmp_path / "hf" / "hub"
    hf_repo(hub, "acme/tiny-GGUF", ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-F16.gguf"], model_path)
    hf_repo(hub, "acme/solo-GGUF", ["solo.gguf"], model_path)
    hf_repo(hub, "acme/big-GGUF", ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"], model_path)
    cache = tmp_path / "llama.cpp"
    link(model_path, cache / "acme_cached-GGUF_cached-Q4_K_M.gguf")
    (cache / "manifest=acme=cached-GGUF=latest.json").write_text(
        json.dumps({"ggufFile": {"rfilename": "cached-Q4_K_M.gguf"}}))
    ollama_model(tmp_path / "ollama", "gemma3", "1b", model_path, stop=["<end_of_turn>", "e"])
    ollama_model(tmp_path / "ollama", "custom", "latest", model_path, namespace="someone")
    link(model_path, home / ".lmstudio" / "models" / "lmstudio-community" / "gemma-3-270m-it-GGUF"
         / "gemma-3-270m-it-Q4_K_M.gguf")
    link(model_path, tmp_path / "one" / "only.gguf")
    link(model_path, tmp_path / "two" / "pair-Q4_K_M.gguf")
    link(model_path, tmp_path / "two" / "pair-Q8_0.gguf")
    config = tmp_path / "llamabatch.toml"
    config.write_text('[models]\nfast = "ollama:gemma3:1b"\nlocal = "two:Q8_0"\n')
    return tmp_path, {**os.environ, **env}


# --- resolving each spelling (no model load) -------------------------------------------


def test_each_spelling_resolves_to_its_file_and_keeps_the_users_name(stores):
    tmp, _ = stores
    snap = tmp / "hf" / "hub" / "models--acme--tiny-GGUF" / "snapshots" / "0123abcd"
    cases = {
        "hf:acme/tiny-GGUF:Q8_0": (snap / "tiny-Q8_0.gguf", "hf"),
        "hf:acme/tiny-GGUF:q4_k_m": (snap / "tiny-Q4_K_M.gguf", "hf"),
        "hf:acme/solo-GGUF": (tmp / "hf/hub/models--acme--solo-GGUF/snapshots/0123abcd/solo.gguf", "hf"),
        "hf:acme/cached-GGUF": (tmp / "llama.cpp" / "acme_cached-GGUF_cached-Q4_K_M.gguf", "llama.cpp"),
        "ollama:gemma3:1b": (tmp / "ollama" / "blobs" / ("sha256-" + "gemma31b".encode().hex().ljust(64, "0")), "ollama"),
        "lmstudio:lmstudio-community/gemma-3-270m-it-GGUF": (
            tmp / "home/.lmstudio/models/lmstudio-community/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf",
            "lmstudio"),
    }
    for spelling, (path, source) in cases.items():
        ref = resolve_spelling(spelling)
        assert (Path(ref.path), ref.source, ref.name) == (path, source, spelling)
    assert resolve_spelling("ollama:gemma3:1b").stop == ("<end_of_turn>", "e")
    assert resolve_spelling("ollama:someone/custom").stop == ()


def test_folders_files_and_split_models(stores):
    tmp, _ = stores
    assert resolve_spelling(str(tmp / "one")).path == str(tmp / "one" / "only.gguf")
    assert resolve_spelling(str(tmp / "one")).name == "only"
    ref = resolve_spelling(f"{tmp / 'two'}:Q8_0")
    assert (ref.path, ref.name, ref.source) == (str(tmp / "two" / "pair-Q8_0.gguf"), "pair-Q8_0", "folder")
    with pytest.raises(ModelNotFound) as err:
        resolve_spelling(str(tmp / "two"))
    assert "holds 2 GGUFs" in str(err.value) and "pair-Q4_K_M.gguf, pair-Q8_0.gguf" in str(err.value)
    big = resolve_spelling("hf:acme/big-GGUF")
    assert big.path.endswith("big-Q4_K_M-00001-of-00002.gguf") and len(big.shards) == 2
    with pytest.raises(ModelNotFound, match="shard 2 of 2 .* pass the first one"):
        resolve_spelling(big.shards[1])


def test_aliases_resolve_through_other_spellings_and_report_the_alias(stores):
    tmp, _ = stores
    aliases = {"fast": "ollama:gemma3:1b", "both": "fast", "loop": "loop"}
    ref = resolve_model_ref("both", aliases)
    assert (ref.name, ref.source, ref.stop) == ("both", "ollama", ("<end_of_turn>", "e"))
    with pytest.raises(ModelNotFound, match="refers to itself"):
        resolve_model_ref("loop", aliases)


@pytest.mark.parametrize(
    "spelling, fragments",
    [
        ("ollama:nope", ["not in Ollama's store", "manifests/registry.ollama.ai/library/nope/latest",
                         "fetch it with: ollama pull nope:latest"]),
        ("hf:acme/none-GGUF:Q4_K_M", ["not in the Hugging Face cache", "hf/hub/models--acme--none-GGUF",
                                      "llama.cpp/acme_none-GGUF_*.gguf",
                                      "huggingface-cli download acme/none-GGUF --include '*Q4_K_M*.gguf'"]),
        ("hf:acme/tiny-GGUF:Q2_K", ["no Q2_K GGUF in", "tiny-Q4_K_M.gguf, tiny-Q8_0.gguf", "huggingface-cli download"]),
        ("lmstudio:nobody/nothing", [".lmstudio/models/nobody/nothing", ".cache/lm-studio/models/nobody/nothing",
                                     "lms get nobody/nothing"]),
        ("nosuch", ["unknown model 'nosuch'", "no alias in [models]", "hf:ORG/REPO", "llamabatch models"]),
    ],
)
def test_unknown_names_say_where_they_looked_and_how_to_fetch(stores, spelling, fragments):
    with pytest.raises(ModelNotFound) as err:
        resolve_spelling(spelling)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_list_models_finds_every_store_with_header_fields(stores, model_path):
    tmp, _ = stores
    rows = {row["name"]: row for row in list_models({"fast": "ollama:gemma3:1b"})}
    expected = {
        "hf:acme/tiny-GGUF:Q4_K_M": "hf", "hf:acme/tiny-GGUF:Q8_0": "hf", "hf:acme/solo-GGUF": "hf",
        "hf:acme/big-GGUF": "hf", "hf:acme/cached-GGUF": "llama.cpp", "ollama:gemma3:1b": "ollama",
        "ollama:someone/custom:latest": "ollama", "lmstudio:lmstudio-community/gemma-3-270m-it-GGUF": "lmstudio",
        "fast": "alias",
    }
    for name, source in expected.items():
        row = rows[name]
        assert row["source"] == source
        assert (row["architecture"], row["quantization"], row["context_length"], row["chat_template"]) == (
            "gemma3", "Q4_K_M", 32768, False), row
        assert row["error"] is None
        # every name listed is one -m accepts, and names the same file
        assert os.path.realpath(resolve_model_ref(name, {"fast": "ollama:gemma3:1b"}).path) == os.path.realpath(
            row["path"])
    size = os.path.getsize(model_path)
    assert rows["hf:acme/solo-GGUF"]["size"] == size
    assert rows["hf:acme/big-GGUF"]["size"] == 2 * size  # both shards
    assert not any("mmproj" in name for name in rows)


# --- loading through each spelling (the bundled model) ---------------------------------


@pytest.mark.model
@pytest.mark.parametrize("spelling", ["hf:acme/tiny-GGUF:Q8_0", "hf:acme/cached-GGUF", "ollama:gemma3:1b",
                                      "lmstudio:lmstudio-community/gemma-3-270m-it-GGUF", "FOLDER:Q4_K_M"])
def test_each_spelling_loads_and_runs_a_prompt(stores, spelling):
    tmp, _ = stores
    spelling = spelling.replace("FOLDER", str(tmp / "two"))
    with Engine(EngineConfig(model=spelling, **SMALL)) as engine:
        result = engine.submit("The sky is", GREEDY, stream=False).result()
        assert result.error is None and result.usage.completion_tokens > 0
        expected = "pair-Q4_K_M" if spelling.startswith(str(tmp)) else spelling
        assert engine.model_name == expected
        if spelling.startswith("ollama:"):
            assert engine.default_params.stop == ["<end_of_turn>", "e"]  # from its params layer


def llamabatch(*args: str, env: dict, stdin: str | None = None, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "llamabatch", *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=180)


@pytest.mark.model
def test_run_reports_the_users_name_and_uses_ollamas_stops(stores):
    tmp, env = stores
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Describe the sea in one sentence."}], "max_tokens": 24}}
    proc = llamabatch("--config", str(tmp / "llamabatch.toml"), "run", "-", "-m", "fast", "--temperature", "0",
                      "--n-parallel", "1", "--n-ctx", "512", stdin=json.dumps(line) + "\n", env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    body = record["response"]["body"]
    assert body["model"] == "fast"  # the alias the user gave, not a blob hash
    assert "llamabatch run: fast," in proc.stderr
    text = body["choices"][0]["message"]["content"]
    # Ollama's params layer says stop at "e": the reply ends before its first "e"
    assert body["choices"][0]["finish_reason"] == "stop" and "e" not in text, text


@pytest.mark.model
def test_serve_stdin_ready_event_names_the_hf_spelling(stores):
    _, env = stores
    proc = llamabatch("serve-stdin", "-m", "hf:acme/tiny-GGUF:Q4_K_M", "--n-parallel", "1", "--n-ctx", "256",
                      stdin="", env=env)
    assert proc.returncode == 0, proc.stderr
    ready = json.loads(proc.stdout.splitlines()[0])
    assert ready["event"] == "ready" and ready["model"] == "hf:acme/tiny-GGUF:Q4_K_M"


def test_unknown_model_is_one_line_and_exit_1_before_reading_input(stores):
    _, env = stores
    proc = llamabatch("run", "no-such-input.jsonl", "-m", "ollama:nope:7b", env=env)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert "ollama pull nope:7b" in proc.stderr and "manifests/registry.ollama.ai/library/nope/7b" in proc.stderr


def test_models_json_lists_every_store(stores):
    tmp, env = stores
    proc = llamabatch("--config", str(tmp / "llamabatch.toml"), "models", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    names = {row["name"] for row in rows}
    assert {"hf:acme/tiny-GGUF:Q8_0", "hf:acme/cached-GGUF", "ollama:gemma3:1b", "fast", "local",
            "lmstudio:lmstudio-community/gemma-3-270m-it-GGUF"} <= names
    assert set(rows[0]) >= {"source", "name", "path", "size", "architecture", "quantization", "context_length",
                            "chat_template"}
    table = llamabatch("--config", str(tmp / "llamabatch.toml"), "models", env=env)
    assert table.returncode == 0, table.stderr
    assert "ollama:gemma3:1b" in table.stdout and "Q4_K_M" in table.stdout and "32,768" in table.stdout


def test_models_with_empty_stores_says_where_it_looked(tmp_path, model_path):
    env = {**os.environ, "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "LLAMA_CACHE": str(tmp_path / "l"),
           "OLLAMA_MODELS": str(tmp_path / "o"), "LLAMABATCH_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HF_HUB_CACHE", None)
    env.pop("XDG_CACHE_HOME", None)
    proc = llamabatch("models", "--json", env=env, cwd=tmp_path)
    assert proc.returncode == 0
    # the stores are empty; what an installed package brings (the instruct extra's SmolLM2) is listed
    assert [json.loads(line)["source"] for line in proc.stdout.splitlines()] in ([], ["package"])
    assert "no models in the stores; looked in hf " + str(tmp_path / "hf" / "hub") in proc.stderr
