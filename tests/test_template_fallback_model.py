"""A GGUF without a chat template gets llama.cpp's format named by its metadata, end to end.

The bundled Gemma 3 270M is copied with its general.name changed (tests/gguf_tools.py), so
llama.cpp still loads it while its metadata says Mistral or Phi-3. The prompt the engine
builds must be exactly what llama_chat_apply_template renders for that format, and every
command says once on stderr which format it fell back to.
"""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from gguf_tools import with_metadata
from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.models.gguf_header import read_header

pytestmark = pytest.mark.model

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def llama_cpp_render(name: str, messages: list[dict]) -> str:
    import llama_cpp

    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, len(buf))
    assert 0 < n < len(buf)
    return buf.raw[:n].decode()


@pytest.fixture(scope="module")
def renamed(tmp_path_factory, model_path):
    folder = tmp_path_factory.mktemp("renamed")

    def make(general_name: str):
        path = folder / (general_name.replace(" ", "-") + ".gguf")
        if not path.exists():
            with_metadata(model_path, path, {"general.name": general_name, "general.basename": None,
                                             "general.finetune": None})
        return str(path)

    yield make
    for path in folder.iterdir():
        path.unlink()


@pytest.mark.parametrize("general_name, expected", [("Mistral 7B Instruct v0.2", "mistral-v1"),
                                                    # "Phi 3", not "Phi-3": llama.cpp itself looks for
                                                    # Phi-3's tokens in a vocabulary named "phi-3"
                                                    ("Phi 3 Mini 4K Instruct", "phi3")])
def test_metadata_picks_llama_cpps_format_and_the_engine_renders_it_exactly(renamed, general_name, expected):
    path = renamed(general_name)
    assert read_header(path).get("general.name") == general_name
    notices: list[str] = []
    with Engine(EngineConfig(model=path, n_parallel=1, n_ctx=512), on_notice=notices.append) as engine:
        result = engine.submit(MESSAGES, SamplingParams(max_tokens=4, temperature=0), stream=False).result()
        assert result.error is None
        assert engine.chat_template.name == expected
        assert engine.render_chat(MESSAGES) == llama_cpp_render(expected, MESSAGES)
        engine.submit(MESSAGES, SamplingParams(max_tokens=1), stream=False).result()
    assert notices == [f"the GGUF has no chat template; chat messages use llama.cpp's built-in {expected} "
                       f"(from general.name {general_name!r})"]


def test_run_says_the_fallback_once_on_stderr(renamed):
    path = renamed("Mistral 7B Instruct v0.2")
    lines = "".join(json.dumps({"id": i, "messages": MESSAGES, "max_tokens": 2}) + "\n" for i in range(3))
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "run", "-", "-m", path, "--n-parallel", "2",
                           "--n-ctx", "512"], input=lines, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("chat messages use llama.cpp's built-in mistral-v1") == 1, proc.stderr
    assert len(proc.stdout.splitlines()) == 3
