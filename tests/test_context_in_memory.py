"""n_ctx auto under a max_memory too small for slots of a default 4,096 tokens:
each slot gets what max_memory holds beside the weights (settings/context_sizing.slot_in_memory,
asking the engine's own memory check), in every front end (run, its dry run, serve-stdin,
serve's extra slots, chat, the library's open_engine), and the dry run says what the run does.

On the scripted fake runner, which loads nothing: the model is a GGUF header alone, shaped as
SmolLM2-135M (30 layers, 3 KV heads of 64: 23,040 bytes a token of f16 KV cache), so a
--max-memory of 50M holds 2,275 tokens of KV cache: 2,048 in whole 256s."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from llamabatch import EngineConfig, SamplingParams
from llamabatch.chat.context_size import chat_context
from llamabatch.engines import open_engine
from llamabatch.errors import ResourceLimit
from llamabatch.kernel_paths import resources
from llamabatch.settings.context_sizing import slot_in_memory
from llamabatch.settings.ready import settings_for

from cli_harness import FakeEngines, invoke, runner_for
from test_serve_command import serve

UINT32, STRING = 4, 8
HEAD = {"llama.block_count": 30, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
        "llama.embedding_length": 576, "llama.context_length": 8192}
PER_TOKEN = 30 * 2 * 3 * 64 * 2  # layers x (K and V) x KV heads x head size x 2 bytes (f16)
QUICK = ["--max-tokens", "4", "--temperature", "0"]


def _text(value: str) -> bytes:
    return struct.pack("<Q", len(value.encode())) + value.encode()


def header_only_gguf(folder: Path) -> str:
    """A GGUF of metadata and no tensors: what the memory check reads (its weights: its size)."""
    kvs = [_text("general.architecture") + struct.pack("<I", STRING) + _text("llama")]
    kvs += [_text(key) + struct.pack("<II", UINT32, value) for key, value in HEAD.items()]
    path = folder / "small.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return str(path)


@pytest.fixture
def model(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))  # no calibration read or written
    return header_only_gguf(tmp_path)


def fits(config: EngineConfig, model: str) -> bool:
    try:
        resources.check(config, model)
    except ResourceLimit:
        return False
    return True


def test_the_slot_is_the_most_the_engines_memory_check_allows(model):
    config = EngineConfig(model=model, n_parallel=1, max_memory="50M")
    tokens, why = slot_in_memory(config, model)
    assert tokens == 2048 and PER_TOKEN * 2048 < 50 << 20 < PER_TOKEN * 2304
    assert fits(config.replace(n_ctx=2048), model) and not fits(config.replace(n_ctx=2304), model)
    assert why.startswith("n_ctx auto: 2,048 tokens a slot, what max_memory 50M holds for 1 slot beside ")
    assert slot_in_memory(config.replace(n_parallel=2), model)[0] == 1024  # shared by two
    assert slot_in_memory(config.replace(max_memory="1G"), model) is None  # the default fits: nothing changes
    assert slot_in_memory(config.replace(n_ctx=4096), model) is None  # an explicit n_ctx is kept


def test_run_sizes_the_slot_to_max_memory_and_its_dry_run_says_the_same(model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "Hi there"}) + "\n")
    args = ["run", str(inp), "-m", model, "--n-parallel", "1", "--max-memory", "50M", *QUICK]
    run = invoke(args, runner=runner_for())
    assert run.exit_code == 0, run.stderr
    assert [r["error"] for r in map(json.loads, run.stdout.splitlines())] == [None]
    assert run.engines[0].config.n_ctx == 2048 and run.engines[0].slot_ctx == 2048
    header = next(line for line in run.stderr.splitlines() if "slots x" in line)
    assert "1 slots x 2048 tokens (n_ctx auto: 2,048 tokens a slot, what max_memory 50M holds" in header
    assert "4,096 tokens a slot hold every line" not in header  # said before the slots were counted: replaced
    dry = invoke([*args, "--dry-run", "--json"], runner=runner_for())
    assert dry.exit_code == 0, dry.stderr
    slots = json.loads(dry.stdout)["slots"]
    assert (slots["n_parallel"], slots["slot_ctx"], slots["n_ctx"]) == (1, 2048, 2048)
    assert slots["context_reason"].startswith("n_ctx auto: 2,048 tokens a slot, what max_memory 50M holds")


def test_the_dry_run_flags_a_line_the_fitted_slot_cannot_hold_as_the_run_refuses_it(model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "Hi"}) + "\n" + json.dumps({"id": "b", "prompt": "x" * 3000}) + "\n")
    args = ["run", str(inp), "-m", model, "--n-parallel", "1", "--max-memory", "50M", *QUICK]
    run = invoke(args, runner=runner_for())
    errors = {r["id"]: r["error"] for r in map(json.loads, run.stdout.splitlines())}
    assert errors["a"] is None and errors["b"]["code"] == "context_overflow"
    dry = json.loads(invoke([*args, "--dry-run", "--json"], runner=runner_for()).stdout)
    assert (dry["valid"], dry["invalid_by_code"]) == (1, {"context_overflow": 1})


def test_serve_stdin_sizes_the_slot_to_max_memory(model):
    code, session, err = serve(["-m", model, "--n-parallel", "1", "--max-memory", "50M"], lambda s: None)
    assert code == 0, err
    ready = session.wait_for(lambda e: e["event"] == "ready")
    assert (ready["n_parallel"], ready["slot_ctx"]) == (1, 2048)


def test_the_library_and_serves_extra_slots_size_every_slot_to_max_memory(model):
    engines: list = []
    with open_engine(EngineConfig(model=model, n_parallel=1, max_memory="50M"), factory=FakeEngines(
            runner_for(), engines)) as engine:
        assert (engine.config.n_ctx, engine.slot_ctx) == (2048, 2048)
    # serve opens its engine with its online slots on top: the fit is over all of them
    with open_engine(EngineConfig(model=model, n_parallel=1, max_memory="50M"), factory=FakeEngines(
            runner_for(), engines), extra_slots=1) as engine:
        assert (engine.config.n_parallel, engine.config.n_ctx, engine.slot_ctx) == (2, 2048, 1024)


def test_chat_sizes_the_slot_to_max_memory(model):
    resolved = settings_for(EngineConfig(model=model, n_parallel=1, max_memory="50M"), SamplingParams())
    sized, why = chat_context(resolved)
    assert (sized.engine.n_ctx, sized.engine.slot_ctx) == (2048, 2048)
    assert why.startswith("n_ctx auto: 2,048 tokens a slot, what max_memory 50M holds")


def test_where_not_even_256_tokens_a_slot_fit_one_slot_is_told_to_raise_max_memory(model):
    config = EngineConfig(model=model, n_parallel=1, max_memory="1M")  # 45 tokens of KV cache
    assert slot_in_memory(config, model) is None  # nothing to fit: the check says why, in its words
    with pytest.raises(ResourceLimit) as caught:
        resources.check(config, model)
    assert str(caught.value).endswith("raise max_memory or use --cache-type-k q8_0 --cache-type-v q8_0")
    with pytest.raises(ResourceLimit, match="lower n_parallel"):  # two slots can still be one
        resources.check(config.replace(n_parallel=2), model)
