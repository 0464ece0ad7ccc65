"""The chat conversation and its prompts, without a model: a fake tokenizer and the fake runner."""
from __future__ import annotations

import json

import pytest

from fake_runner import FakeRunner, byte_tokens, text_tokens
from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.models.chat_template import ChatTemplate, builtin_template
from llamabatch.chat.conversation import Conversation, PromptBuilder
from llamabatch.errors import InvalidRequest
from llamabatch.llama.chat_formats import LlamaChatFormats


def gemma_template() -> ChatTemplate:
    return builtin_template("gemma", LlamaChatFormats())


BOS = 2


def char_tokenize(text: str) -> list[int]:
    """One token per character, after a BOS, like a tokenizer that adds BOS to every text."""
    return [BOS] + text_tokens(text)


def exchange(conv: Conversation, user: str, reply: str) -> None:
    conv.add("user", user)
    conv.add("assistant", reply)


# -- the transcript ---------------------------------------------------------------------


def test_full_puts_the_system_prompt_first_and_clear_keeps_it():
    conv = Conversation("Be terse.")
    exchange(conv, "Hi", "Hello")
    assert conv.full() == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello"}]
    conv.clear()
    assert conv.full() == [{"role": "system", "content": "Be terse."}]
    assert Conversation().full() == []


def test_drop_oldest_exchange_never_drops_the_newest_user_message():
    conv = Conversation("sys")
    exchange(conv, "u1", "a1")
    exchange(conv, "u2", "a2")
    conv.add("user", "u3")
    assert conv.drop_oldest_exchange() == 2
    assert [m["content"] for m in conv.full()] == ["sys", "u2", "a2", "u3"]
    assert conv.drop_oldest_exchange() == 2
    assert conv.drop_oldest_exchange() == 0
    assert [m["content"] for m in conv.full()] == ["sys", "u3"]


def test_pop_reply_only_removes_an_assistant_message():
    conv = Conversation()
    conv.add("user", "u1")
    assert conv.pop_reply() is None
    conv.add("assistant", "a1")
    assert conv.pop_reply() == "a1"
    assert conv.last_role == "user"


def test_save_then_load_gives_the_same_transcript(tmp_path):
    conv = Conversation("You are terse.")
    exchange(conv, "Hi", "Hello\n\nthere ✓")
    exchange(conv, "And?", "")
    path = tmp_path / "chat.json"
    conv.save(str(path), model="m")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["version"] == 1 and data["model"] == "m"
    assert data["messages"][0] == {"role": "system", "content": "You are terse."}
    loaded = Conversation.load(str(path))
    assert loaded.system == conv.system and loaded.messages == conv.messages
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_load_accepts_a_bare_message_list_and_rejects_bad_files(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    assert Conversation.load(str(bare)).messages == [{"role": "user", "content": "Hi"}]
    bad_cases = {
        "missing.json": None,
        "notjson.json": "{not json",
        "tool.json": json.dumps([{"role": "tool", "content": "x"}]),
        "late_system.json": json.dumps([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]),
        "norole.json": json.dumps({"messages": [{"content": "x"}]}),
    }
    for name, text in bad_cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(InvalidRequest) as info:
            Conversation.load(str(path))
        assert "\n" not in str(info.value) and name in str(info.value)


# -- prompts ------------------------------------------------------------------------------


def test_prompt_extends_the_previous_prompt_with_the_generated_reply_tokens():
    # Gemma's template strips the reply; the reply's text has other tokenizations too
    # (two raw-byte tokens spell "é"). Re-tokenizing the rendering would lose the cache at
    # the reply; the builder re-sends exactly what was evaluated and generated.
    builder = PromptBuilder(gemma_template(), char_tokenize, slot_ctx=4096)
    conv = Conversation("sys")
    conv.add("user", "Hi")
    first = builder.build(conv, max_tokens=64)
    assert first.tokens == char_tokenize(first.text) and not first.spliced
    reply_tokens = text_tokens("\n Caf") + byte_tokens("é".encode()) + text_tokens(" ok \n")
    reply_text = "\n Café ok \n"
    builder.remember(first, reply_text, reply_tokens)
    conv.add("assistant", reply_text)
    conv.add("user", "More")
    second = builder.build(conv, max_tokens=64)
    assert second.spliced
    assert second.tokens[:len(first.tokens) + len(reply_tokens)] == first.tokens + reply_tokens
    tail = "<end_of_turn>\n<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n"
    assert second.tokens[len(first.tokens) + len(reply_tokens):] == text_tokens(tail)  # no second BOS
    assert second.text.startswith(first.text) and second.text.endswith(tail)


def test_prompt_is_tokenized_afresh_when_the_splice_would_be_wrong():
    builder = PromptBuilder(gemma_template(), char_tokenize, slot_ctx=4096)
    conv = Conversation()
    conv.add("user", "Hi")
    first = builder.build(conv, max_tokens=64)
    # a stop string was cut from the text: the tokens do not spell it, so none are reused
    builder.remember(first, "Hello", None)
    exchange_then = [dict(m) for m in conv.messages]
    conv.add("assistant", "Hello")
    conv.add("user", "More")
    assert not builder.build(conv, max_tokens=64).spliced
    # the reply was edited (or the conversation replaced) after it was remembered
    builder.remember(first, "Hello", text_tokens("Hello"))
    conv = Conversation(None, exchange_then + [{"role": "assistant", "content": "Bye"},
                                               {"role": "user", "content": "More"}])
    fresh = builder.build(conv, max_tokens=64)
    assert not fresh.spliced and fresh.tokens == char_tokenize(fresh.text)


def test_prompt_is_tokenized_afresh_when_the_template_rewrites_earlier_turns():
    # A template that numbers the turns in a header is not prefix-stable.
    def render(messages, add_generation_prompt):
        body = "".join(f"[{m['role']}] {m['content']}\n" for m in messages)
        return f"({len(messages)} messages)\n{body}" + ("[assistant] " if add_generation_prompt else "")

    builder = PromptBuilder(ChatTemplate("counting", "test", render), char_tokenize, slot_ctx=4096)
    conv = Conversation()
    conv.add("user", "Hi")
    first = builder.build(conv, max_tokens=64)
    builder.remember(first, "Hello", text_tokens("Hello"))
    conv.add("assistant", "Hello")
    conv.add("user", "More")
    second = builder.build(conv, max_tokens=64)
    assert not second.spliced and second.tokens == char_tokenize(second.text)


def test_the_same_prompt_again_reuses_its_tokens():
    builder = PromptBuilder(gemma_template(), char_tokenize, slot_ctx=4096)
    conv = Conversation()
    conv.add("user", "Hi")
    first = builder.build(conv, max_tokens=64)
    builder.remember(first, " x", [999])  # tokens that re-tokenizing would never give
    conv.add("assistant", " x")
    conv.add("user", "More")
    second = builder.build(conv, max_tokens=64)
    builder.remember(second, "y", text_tokens("y"))
    assert builder.build(conv, max_tokens=64).tokens == second.tokens  # /retry: same prompt


def test_overflow_drops_oldest_exchanges_down_to_half_the_budget_and_keeps_the_system_prompt():
    builder = PromptBuilder(gemma_template(), char_tokenize, slot_ctx=400)
    assert builder.budget(100) == 300 and builder.budget(10_000) == 200
    conv = Conversation("SYS")
    for i in range(6):
        exchange(conv, f"question {i} " + "q" * 20, f"answer {i} " + "a" * 20)
    conv.add("user", "last question")
    prompt = builder.build(conv, max_tokens=100)
    assert prompt.dropped >= 1 and prompt.fits
    assert len(prompt.tokens) <= 150  # dropping went on to half the budget
    assert conv.system == "SYS" and prompt.text.startswith("<start_of_turn>user\nSYS\n\n")
    assert conv.messages[-1] == {"role": "user", "content": "last question"}
    assert conv.messages[0]["role"] == "user"
    assert 1 + len(conv.messages) == prompt.n_messages
    # without overflow nothing is dropped
    again = builder.build(conv, max_tokens=100)
    assert again.dropped == 0 and again.text == prompt.text


def test_a_message_too_big_for_the_context_is_kept_but_marked_as_not_fitting():
    builder = PromptBuilder(gemma_template(), char_tokenize, slot_ctx=100)
    conv = Conversation()
    exchange(conv, "u1", "a1")
    conv.add("user", "x" * 200)
    prompt = builder.build(conv, max_tokens=10)
    assert prompt.dropped == 1 and not prompt.fits
    assert conv.messages == [{"role": "user", "content": "x" * 200}]


# -- with the engine's prefix cache -------------------------------------------------------


def test_each_turn_reuses_the_whole_previous_conversation_from_the_cache():
    # The fake model answers with leading and trailing whitespace, which Gemma's template
    # strips: only re-sending the generated tokens keeps the cache valid past the prompt.
    runner = FakeRunner(n_slots=2, slot_ctx=2048, reply=lambda prompt: f"\n  reply {len(prompt)}  \n",
                        metadata={"general.architecture": "gemma3"})
    with Engine(EngineConfig(n_parallel=2), runner=runner) as engine:
        assert engine.chat_template.name == "gemma"
        builder = PromptBuilder.for_engine(engine)
        conv = Conversation("Be brief.")
        previous = None
        for user in ("Hi", "Tell me more", "Thanks"):
            conv.add("user", user)
            prompt = builder.build(conv, max_tokens=32)
            result = engine.submit(prompt.tokens, SamplingParams(max_tokens=32, temperature=0)).result()
            assert result.finish_reason == "stop", result.error
            if previous is not None:
                # the whole previous prompt and reply (the reply ended with EOG, so its last
                # token was evaluated to sample EOG and sits in the cache too)
                assert result.usage.cached_tokens == previous
            previous = result.usage.prompt_tokens + result.usage.completion_tokens
            builder.remember(prompt, result.text, result.token_ids)
            conv.add("assistant", result.text)
        assert runner.violations == []
