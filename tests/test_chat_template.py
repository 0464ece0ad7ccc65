from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llamabatch.models import chat_template
from llamabatch.models.chat_template import (builtin_names, builtin_template, choose_format, from_gguf, jinja_template, recognised_format, validate_messages)
from llamabatch.errors import InvalidRequest
from llamabatch.llama.chat_formats import LlamaChatFormats

FORMATS = LlamaChatFormats()

# What a model would generate for turn 1 after each built-in's generation prompt:
# after "Assistant:" a model writes its own leading space. The formats listed here keep
# the byte-for-byte prefix property (others, like mistral's, are re-tokenized by
# conversation.PromptBuilder).
FIRST_REPLY = {"gemma": "Hello there.", "chatml": "Hello there.", "llama3": "Hello there.",
               "phi3": "Hello there.", "plain": " Hello there."}


def builtin(name: str):
    return builtin_template(name, FORMATS, "<s>")

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
    return from_gguf(text, {"general.architecture": "gemma3"}, "<bos>", "<eos>", formats=FORMATS, **kwargs)


def no_template(metadata: dict, **kwargs):
    return from_gguf(None, metadata, "<bos>", "<eos>", formats=FORMATS, **kwargs)


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
        (["hi"], "messages[0] must be an object with role and content, got a string"),
        ([user("hi"), {"role": "bot", "content": "x"}], "messages[1].role must be one of"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": ["user"], "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content must be a string or a list of text parts, got null"),
        ([{"role": "user", "content": 5}], "messages[0].content must be a string or a list of text parts, got a number"),
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


# --- built-ins: llama.cpp's formats and our plain transcript --------------------------


def test_builtin_names_are_llama_cpps_and_plain():
    names = builtin_names(FORMATS)
    assert len(names) > 40
    for name in ("llama2", "mistral-v7", "phi3", "deepseek3", "chatml", "gemma", "llama3", "plain"):
        assert name in names


@pytest.mark.parametrize("name", sorted(FIRST_REPLY))
@pytest.mark.parametrize("with_system", [False, True])
def test_builtin_next_turn_extends_previous_prompt(name, with_system):
    template = builtin(name)
    head = [SYSTEM] if with_system else []
    reply = FIRST_REPLY[name]
    turn1 = template.render(head + [user("What is 2+2?")])
    turn2 = template.render(head + [user("What is 2+2?"), assistant(reply), user("And 3+3?")])
    assert turn2.startswith(turn1 + reply)
    assert len(turn2) > len(turn1 + reply)


@pytest.mark.parametrize("name", ["gemma", "chatml", "llama3", "llama2", "llama2-sys-bos", "mistral-v7", "phi3",
                                  "plain"])
def test_builtins_emit_no_leading_bos_text(name):
    prompt = builtin(name).render([SYSTEM, user("hi")])
    for bos in ("<bos>", "<s>", "<|begin_of_text|>", "<|endoftext|>"):
        assert not prompt.startswith(bos)


def test_gemma_exact_prompt_folds_system_into_first_user_turn():
    prompt = builtin("gemma").render([SYSTEM, user(" Hi "), assistant("Hello!"), user("Bye")])
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
    assert builtin("gemma").render(conversation, add_generation_prompt) == official.render(conversation,
                                                                                           add_generation_prompt)


def test_chatml_exact_prompt():
    prompt = builtin("chatml").render([SYSTEM, user("Hi")])
    assert prompt == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_llama3_exact_prompt():
    prompt = builtin("llama3").render([SYSTEM, user("Hi")])
    assert prompt == ("<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_plain_transcript_ends_with_assistant_and_stops_at_next_user():
    template = builtin("plain")
    prompt = template.render([SYSTEM, user("Hi"), assistant("Hello."), user("Bye")])
    assert prompt == "System: You are terse.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: Bye\n\nAssistant:"
    assert template.render([user("Hi")], add_generation_prompt=False) == "User: Hi"
    assert "\nUser:" in template.stop


def test_render_validates_messages():
    with pytest.raises(InvalidRequest, match="role"):
        builtin("chatml").render([{"role": "robot", "content": "x"}])


# --- from_gguf: choosing a format from the metadata -------------------------------------


def llama_cpp_render(name: str, messages: list[dict], add_ass: bool = True) -> str:
    """llama_chat_apply_template called directly, as the reference to compare against."""
    import ctypes

    import llama_cpp

    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(8192)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_ass, buf, len(buf))
    assert 0 < n < len(buf)
    return buf.raw[:n].decode()


CONVERSATION = [SYSTEM, user("Hi"), assistant("Hello."), user("Bye")]


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ({"general.architecture": "llama", "general.name": "Mistral 7B Instruct v0.2"}, "mistral-v1"),
        ({"general.architecture": "llama", "general.name": "Llama 2 7B Chat"}, "llama2-sys"),
        ({"general.architecture": "phi3", "general.name": "Phi 3 Mini 4k Instruct"}, "phi3"),
        ({"general.architecture": "phi3"}, "phi3"),
        ({"general.architecture": "llama", "general.basename": "DeepSeek-R1-Distill-Llama"}, "deepseek3"),
        ({"general.architecture": "deepseek2"}, "deepseek3"),
        ({"general.architecture": "gemma3"}, "gemma"),
        ({"general.architecture": "qwen3moe"}, "chatml"),
        ({"general.architecture": "mamba"}, "plain"),
        ({}, "plain"),
    ],
)
def test_gguf_without_template_gets_llama_cpps_format_named_by_its_metadata(metadata, expected):
    template = no_template(metadata)
    assert template.name == expected
    assert template.fallback_reason.startswith("the GGUF has no chat template; chat messages use")
    assert f"built-in {expected} (from " in template.fallback_reason
    if expected != "plain":
        assert template.render(CONVERSATION) == llama_cpp_render(expected, CONVERSATION)


def test_mistral_and_phi3_render_exactly_what_llama_cpp_renders():
    mistral = no_template({"general.architecture": "llama", "general.name": "Mistral-7B-Instruct-v0.3"},
                          has_token=lambda t: t == "[INST]")
    assert mistral.name == "mistral-v3"
    assert mistral.render(CONVERSATION) == llama_cpp_render("mistral-v3", CONVERSATION)
    assert mistral.render(CONVERSATION) == "[INST] You are terse.\n\nHi[/INST] Hello.</s>[INST] Bye[/INST]"
    phi3 = no_template({"general.architecture": "phi3"})
    assert phi3.render([user("Hi")]) == llama_cpp_render("phi3", [user("Hi")]) == "<|user|>\nHi<|end|>\n<|assistant|>\n"


@pytest.mark.parametrize(
    "tokens, pre, expected",
    [({"[INST]"}, "default", "mistral-v3"), ({"[INST]"}, "tekken", "mistral-v3-tekken"),
     ({"[INST]", "[SYSTEM_PROMPT]"}, "default", "mistral-v7"),
     ({"[INST]", "[SYSTEM_PROMPT]"}, "tekken", "mistral-v7-tekken"), (set(), "default", "mistral-v1")],
)
def test_mistral_generation_follows_its_vocabulary(tokens, pre, expected):
    metadata = {"general.architecture": "llama", "general.name": "Mistral", "tokenizer.ggml.pre": pre}
    assert choose_format(metadata, tokens.__contains__, builtin_names(FORMATS))[0] == expected


@pytest.mark.parametrize(
    "tokens, expected",
    [({"<|start_header_id|>"}, "llama3"), ({"<|im_start|>"}, "chatml"), ({"<|assistant|>", "<|end|>"}, "phi3"),
     ({"<｜Assistant｜>"}, "deepseek3"), ({"<start_of_turn>"}, "gemma"), (set(), "plain")],
)
def test_a_llama_architecture_gguf_without_name_hints_is_told_apart_by_its_chat_tokens(tokens, expected):
    name, why = choose_format({"general.architecture": "llama"}, tokens.__contains__, builtin_names(FORMATS))
    assert name == expected
    if tokens:
        assert "vocabulary" in why


def test_gguf_template_is_used_and_its_bos_removed():
    template = gguf_template("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                             "{% if add_generation_prompt %}[assistant]{% endif %}")
    assert template.name == "gguf"
    assert template.render([user("hi")]) == "[user]hi[assistant]"
    assert template.render([user("hi")], add_generation_prompt=False) == "[user]hi"


def test_gguf_bos_kept_when_tokenizer_does_not_add_one():
    template = gguf_template("{{ bos_token }}{{ messages[0].content }}", tokenizer_adds_bos=False)
    assert template.render([user("hi")]) == "<bos>hi"


@pytest.mark.parametrize("said", [False, "false", "False"])  # the header's bool, llama.cpp's metadata string
def test_gguf_bos_kept_when_its_metadata_says_the_tokenizer_adds_none(said):
    # SmolLM2: BOS is <|im_start|> and add_bos_token is false, so the first marker is the template's own
    metadata = {"general.architecture": "llama", "tokenizer.ggml.add_bos_token": said}
    template = from_gguf("{{ bos_token }}{{ messages[0].content }}", metadata, "<|im_start|>", "<|im_end|>",
                         formats=FORMATS)
    assert template.render([user("hi")]) == "<|im_start|>hi"
    said_true = {**metadata, "tokenizer.ggml.add_bos_token": "true"}
    assert from_gguf("{{ bos_token }}x", said_true, "<s>", "</s>", formats=FORMATS).render([user("hi")]) == "x"


def test_jinja_gets_trim_blocks_strftime_and_plain_tojson():
    text = ("{% for m in messages %}\n"
            "    {% if m.content %}{{ m.content | tojson }}{% endif %}\n"
            "{% endfor %}\n"
            "{{ strftime_now('%Y') | length }}")
    template = gguf_template(text)
    # Without trim_blocks/lstrip_blocks this would be '\n    "<b>&\'é"\n\n4'.
    assert template.render([user("<b>&'é")]) == '"<b>&\'é"4'


@pytest.mark.parametrize("name", ["chatml", "phi3", "mistral-v7", "granite-4.0", "plain"])
def test_choice_by_name_overrides_gguf_template(name):
    template = gguf_template("{{ messages[0].content }}", choice=name)
    assert template.name == name
    assert template.fallback_reason is None  # chosen, not fallen back to


def test_choice_by_file_is_a_jinja_template(tmp_path):
    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    template = no_template({"general.architecture": "gemma3"}, choice=str(path))
    assert template.render([user("hi")]) == "<user>hi"
    assert template.source == path.read_text()


def test_unknown_choice_lists_the_builtin_names():
    with pytest.raises(InvalidRequest) as err:
        no_template({"general.architecture": "gemma3"}, choice="robot")
    message = str(err.value)
    assert "'robot'" in message
    for name in builtin_names(FORMATS):
        assert name in message
    assert "\n" not in message


def test_chosen_file_that_does_not_compile_is_invalid_request(tmp_path):
    path = tmp_path / "broken.jinja"
    path.write_text("{% for m in messages %}")
    with pytest.raises(InvalidRequest, match="does not compile"):
        no_template({"general.architecture": "gemma3"}, choice=str(path))


def test_broken_gguf_template_falls_back_to_the_metadatas_format_and_says_why():
    template = gguf_template("{% if %}")
    assert template.name == "gemma"
    assert template.fallback_reason.startswith("the GGUF's chat template is unusable (")
    assert "does not compile" in template.fallback_reason
    assert "llama.cpp's built-in gemma (from general.architecture 'gemma3')" in template.fallback_reason


def test_broken_gguf_template_with_known_markers_gets_the_format_llama_cpp_recognises():
    text = "{% for m in messages %}{{ '<|im_start|>' + m.role }}{% endfor %}{% if %}"
    assert recognised_format(text, FORMATS) == "chatml"
    template = gguf_template(text)
    assert template.name == "chatml"
    assert "recognised in the template's text" in template.fallback_reason


def test_generation_tag_renders_its_body_instead_of_falling_back():
    text = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<a>{{ m.content }}</a>"
            "{% endgeneration %}{% else %}<u>{{ m.content }}</u>{% endif %}{% endfor %}")
    template = gguf_template(text)
    assert template.name == "gguf" and template.fallback_reason is None
    assert template.render([user("q"), assistant("r")], add_generation_prompt=False) == "<u>q</u><a>r</a>"


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
