from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llamabatch import chat_template
from llamabatch.chat_template import BUILTIN_TEMPLATES, from_gguf, jinja_template, validate_messages
from llamabatch.errors import InvalidRequest

# What a model would generate for turn 1 after each built-in's generation prompt:
# after "Assistant:" a model writes its own leading space.
FIRST_REPLY = {"gemma": "Hello there.", "chatml": "Hello there.", "llama3": "Hello there.",
               "plain": " Hello there."}

# The text-only part of Gemma 3's official chat template, to check the built-in against.
GEMMA3_TEXT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "You are terse."}


def gguf_template(text: str, **kwargs):
    return from_gguf(text, "gemma3", "<bos>", "<eos>", **kwargs)


# --- validate_messages -----------------------------------------------------------------


def test_validate_messages_returns_copies_with_text_content():
    messages = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                         "name": "ann"}]
    checked = validate_messages(messages)
    assert checked == [SYSTEM, {"role": "user", "content": "a\nb", "name": "ann"}]
    assert isinstance(messages[1]["content"], list)  # the caller's list is untouched


def test_validate_messages_accepts_every_role():
    roles = ["system", "user", "assistant", "tool"]
    assert [m["role"] for m in validate_messages([{"role": r, "content": ""} for r in roles])] == roles


@pytest.mark.parametrize(
    "messages, fragment",
    [
        (None, "non-empty list"),
        ([], "non-empty list"),
        ({"role": "user", "content": "hi"}, "non-empty list"),
        (["hi"], "messages[0] must be an object"),
        ([user("hi"), {"role": "bot", "content": "x"}], "messages[1].role must be one of"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": ["user"], "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content must be a string"),
        ([{"role": "user", "content": 5}], "messages[0].content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "messages[0].content[0] must be"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content[0] must be"),
    ],
)
def test_validate_messages_rejects_bad_shapes_in_one_line(messages, fragment):
    with pytest.raises(InvalidRequest) as err:
        validate_messages(messages)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


# --- built-ins -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
@pytest.mark.parametrize("with_system", [False, True])
def test_builtin_next_turn_extends_previous_prompt(name, with_system):
    template = BUILTIN_TEMPLATES[name]()
    head = [SYSTEM] if with_system else []
    reply = FIRST_REPLY[name]
    turn1 = template.render(head + [user("What is 2+2?")])
    turn2 = template.render(head + [user("What is 2+2?"), assistant(reply), user("And 3+3?")])
    assert turn2.startswith(turn1 + reply)
    assert len(turn2) > len(turn1 + reply)


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtins_emit_no_bos_text(name):
    prompt = BUILTIN_TEMPLATES[name]().render([SYSTEM, user("hi")])
    for bos in ("<bos>", "<s>", "<|begin_of_text|>", "<|endoftext|>"):
        assert bos not in prompt


def test_gemma_exact_prompt_folds_system_into_first_user_turn():
    prompt = BUILTIN_TEMPLATES["gemma"]().render([SYSTEM, user(" Hi "), assistant("Hello!"), user("Bye")])
    assert prompt == (
        "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


@pytest.mark.parametrize(
    "conversation",
    [
        [user("Hi")],
        [SYSTEM, user("Hi")],
        [SYSTEM, user("Hi"), assistant(" Hello! "), user("Tell me more.\n")],
        [user("a"), assistant("b"), user("c"), assistant("d")],
    ],
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma_builtin_matches_official_template(conversation, add_generation_prompt):
    official = jinja_template("gemma3-official", GEMMA3_TEXT_TEMPLATE, "<bos>", "<eos>")
    builtin = BUILTIN_TEMPLATES["gemma"]()
    assert builtin.render(conversation, add_generation_prompt) == official.render(conversation, add_generation_prompt)


def test_gemma_keeps_a_lone_system_prompt():
    prompt = BUILTIN_TEMPLATES["gemma"]().render([SYSTEM])
    assert prompt == "<start_of_turn>user\nYou are terse.<end_of_turn>\n<start_of_turn>model\n"


def test_chatml_exact_prompt():
    prompt = BUILTIN_TEMPLATES["chatml"]().render([SYSTEM, user("Hi")])
    assert prompt == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_llama3_exact_prompt():
    prompt = BUILTIN_TEMPLATES["llama3"]().render([SYSTEM, user("Hi")])
    assert prompt == ("<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_plain_transcript_ends_with_assistant_and_stops_at_next_user():
    template = BUILTIN_TEMPLATES["plain"]()
    prompt = template.render([SYSTEM, user("Hi"), assistant("Hello."), user("Bye")])
    assert prompt == "System: You are terse.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: Bye\n\nAssistant:"
    assert template.render([user("Hi")], add_generation_prompt=False) == "User: Hi"
    assert "\nUser:" in template.stop


def test_render_validates_messages():
    with pytest.raises(InvalidRequest, match="role"):
        BUILTIN_TEMPLATES["chatml"]().render([{"role": "robot", "content": "x"}])


# --- from_gguf: choosing a template ----------------------------------------------------


@pytest.mark.parametrize(
    "architecture, expected",
    [("gemma3", "gemma"), ("gemma", "gemma"), ("qwen2", "chatml"), ("qwen3moe", "chatml"),
     ("llama", "llama3"), ("mamba", "plain"), (None, "plain")],
)
def test_builtin_chosen_by_architecture_when_gguf_has_no_template(architecture, expected):
    template = from_gguf(None, architecture, "<bos>", "<eos>")
    assert template.name == expected
    assert template.fallback_reason is None


def test_gguf_template_is_used_and_its_bos_removed():
    template = gguf_template("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                             "{% if add_generation_prompt %}[assistant]{% endif %}")
    assert template.name == "gguf"
    assert template.render([user("hi")]) == "[user]hi[assistant]"
    assert template.render([user("hi")], add_generation_prompt=False) == "[user]hi"


def test_gguf_bos_kept_when_tokenizer_does_not_add_one():
    template = gguf_template("{{ bos_token }}{{ messages[0].content }}", tokenizer_adds_bos=False)
    assert template.render([user("hi")]) == "<bos>hi"


def test_jinja_gets_trim_blocks_strftime_and_plain_tojson():
    text = ("{% for m in messages %}\n"
            "    {% if m.content %}{{ m.content | tojson }}{% endif %}\n"
            "{% endfor %}\n"
            "{{ strftime_now('%Y') | length }}")
    template = gguf_template(text)
    # Without trim_blocks/lstrip_blocks this would be '\n    "<b>&\'é"\n\n4'.
    assert template.render([user("<b>&'é")]) == '"<b>&\'é"4'


def test_choice_by_name_overrides_gguf_template():
    template = gguf_template("{{ messages[0].content }}", choice="chatml")
    assert template.name == "chatml"


def test_choice_by_file_is_a_jinja_template(tmp_path):
    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    template = from_gguf(None, "gemma3", "<bos>", "<eos>", choice=str(path))
    assert template.render([user("hi")]) == "<user>hi"
    assert template.source == path.read_text()


def test_unknown_choice_lists_the_builtin_names():
    with pytest.raises(InvalidRequest) as err:
        from_gguf(None, "gemma3", "<bos>", "<eos>", choice="vicuna")
    message = str(err.value)
    assert "vicuna" in message
    for name in BUILTIN_TEMPLATES:
        assert name in message
    assert "\n" not in message


def test_chosen_file_that_does_not_compile_is_invalid_request(tmp_path):
    path = tmp_path / "broken.jinja"
    path.write_text("{% for m in messages %}")
    with pytest.raises(InvalidRequest, match="does not compile"):
        from_gguf(None, "gemma3", "<bos>", "<eos>", choice=str(path))


def test_broken_gguf_template_falls_back_to_builtin_and_says_why():
    template = gguf_template("{% if %}")
    assert template.name == "gemma"
    assert "does not compile" in template.fallback_reason


# --- rendering errors ------------------------------------------------------------------


def test_raise_exception_in_template_is_invalid_request():
    official = jinja_template("gemma3-official", GEMMA3_TEXT_TEMPLATE, "<bos>", "<eos>")
    with pytest.raises(InvalidRequest, match="roles must alternate") as err:
        official.render([user("a"), user("b")])
    assert "\n" not in str(err.value)


def test_runtime_template_error_is_one_line_invalid_request():
    template = gguf_template("{{ messages[0].content }}{% if messages|length > 1 %}{{ 1 / 0 }}{% endif %}")
    with pytest.raises(InvalidRequest, match="chat template 'gguf' failed") as err:
        template.render([user("a"), assistant("b")])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "attack",
    ["{{ messages.__class__.__mro__ }}", "{{ messages.append(1) }}", "{{ messages[0].update(role='x') }}"],
)
def test_template_runs_in_an_immutable_sandbox(attack):
    template = gguf_template("{{ messages[0].content }}{% if messages|length > 1 %}" + attack + "{% endif %}")
    with pytest.raises(InvalidRequest):
        template.render([user("a"), assistant("b")])


def test_chat_template_module_does_not_import_llama_cpp():
    tree = ast.parse(Path(chat_template.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith("llama_cpp") for name in imported)
