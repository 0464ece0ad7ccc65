"""`chat` with n_ctx auto: a conversation may grow to the model's trained context
where the KV memory allowed holds it (llamabatch/chat/context_size.py), on the fake runner."""
from __future__ import annotations

import pytest

from llamabatch import EngineConfig, SamplingParams
from llamabatch.chat import context_size
from llamabatch.chat.context_size import chat_context, context_words, slot_tokens
from llamabatch.settings.ready import settings_for
from cli_harness import invoke, runner_for

GiB = 2**30
PER_TOKEN = 36 * 1024  # KV bytes a cell takes (Gemma 3 270M's size in f16)


def test_the_models_context_when_memory_holds_it():
    assert slot_tokens(32768, PER_TOKEN, 8 * GiB, 1) == (32768, "the model's, n_ctx auto")
    assert slot_tokens(32768, PER_TOKEN, None, 1) == (32768, "the model's, n_ctx auto")  # memory not judged


def test_less_than_the_models_when_memory_holds_less():
    per_slot, why = slot_tokens(131072, 128 * 1024, 2 * GiB, 1, "half of the 4.0 GiB available")
    assert per_slot == 16384  # 2 GiB / 128 KiB, in multiples of 256
    assert why == "n_ctx auto: what half of the 4.0 GiB available holds; the model's is 131,072"
    assert slot_tokens(131072, 128 * 1024, 2 * GiB, 4)[0] == 4096  # shared by four slots
    assert slot_tokens(131072, 128 * 1024, 3 * GiB, 2)[0] == 12288


def test_never_less_than_the_4096_a_slot_held_before():
    per_slot, why = slot_tokens(32768, 128 * 1024, 64 * 2**20, 1, "max_memory 1GiB less the weights")
    assert per_slot == 4096 and why.startswith("n_ctx auto: max_memory 1GiB less the weights holds no more")
    # a model trained for less still gets 4,096 (as before auto), and the line says so
    assert slot_tokens(2048, PER_TOKEN, 8 * GiB, 1) == (4096, "n_ctx auto; the model was trained for 2,048")


def test_an_unreadable_model_keeps_todays_context():
    assert slot_tokens(None, None, None, 1) == (None, "")


def resolved_for(model: str, **engine) -> object:
    resolved = settings_for(EngineConfig(model=model, **{"n_parallel": 1, **engine}), SamplingParams())
    return resolved.replace(model=object())  # as the settings layer leaves it: the model resolved


@pytest.fixture
def checked(monkeypatch):
    """The model check passes for any path (the decision is what is tested here)."""
    monkeypatch.setattr("llamabatch.settings.ready.check_model", lambda resolved: None)


def test_chat_context_sizes_auto_and_honours_an_explicit_n_ctx(checked):
    facts = lambda config, path: (32768, PER_TOKEN, 8 * GiB, "half of the 16.0 GiB available")  # noqa: E731
    sized, why = chat_context(resolved_for("m.gguf"), facts=facts)
    assert (sized.engine.n_ctx, sized.engine.slot_ctx, why) == (32768, 32768, "the model's, n_ctx auto")
    two, _ = chat_context(resolved_for("m.gguf", n_parallel=2), facts=facts)
    assert (two.engine.n_ctx, two.engine.slot_ctx) == (65536, 32768)  # per slot, times n_parallel
    small = lambda config, path: (32768, PER_TOKEN, 256 * 2**20, "max_memory 1GiB less the weights")  # noqa: E731
    assert chat_context(resolved_for("m.gguf"), facts=small)[0].engine.slot_ctx == 7168
    given, why = chat_context(resolved_for("m.gguf", n_ctx=2048), facts=facts)
    assert (given.engine.n_ctx, why) == (2048, "")
    unknown, why = chat_context(resolved_for("m.gguf"), facts=lambda config, path: (None, None, None, ""))
    assert (unknown.engine.n_ctx, unknown.engine.slot_ctx, why) == (None, 4096, "")


def test_an_unreadable_gguf_leaves_4096(checked, tmp_path):
    not_gguf = tmp_path / "fake.gguf"
    not_gguf.write_bytes(b"not a gguf")
    resolved, why = chat_context(resolved_for(str(not_gguf)))  # the real model_facts: (None, None, None, "")
    assert (resolved.engine.n_ctx, resolved.engine.slot_ctx, why) == (None, 4096, "")


def test_the_start_line_says_why():
    assert context_words(32768, "the model's, n_ctx auto") == "32,768-token context (the model's, n_ctx auto)"
    assert context_words(256) == "256-token context"


def fake_chat(args, tmp_path):
    return invoke(["chat", "--max-tokens", "4", "--temperature", "0", *args, "Hi"],
                  runner=runner_for(reply=lambda prompt: " Hello."), env={"XDG_STATE_HOME": str(tmp_path / "state")})


def test_the_cli_opens_its_engine_with_the_sized_context(monkeypatch, tmp_path):
    monkeypatch.setattr(context_size, "_model_facts", lambda config, path: (32768, PER_TOKEN, 8 * GiB, "x"))
    out = fake_chat([], tmp_path)
    assert out.exit_code == 0, out.stderr
    assert [e.config.slot_ctx for e in out.engines] == [32768]
    out = fake_chat(["--n-ctx", "1024"], tmp_path)
    assert out.exit_code == 0, out.stderr
    assert [e.config.slot_ctx for e in out.engines] == [1024]
    monkeypatch.setattr(context_size, "_model_facts", lambda config, path: (None, None, None, ""))
    out = fake_chat([], tmp_path)
    assert [e.config.slot_ctx for e in out.engines] == [4096]
