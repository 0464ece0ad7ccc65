"""Rendering chat messages to a prompt: the GGUF's own Jinja template, one of llama.cpp's
built-in formats, or our plain transcript.

Built-ins never emit BOS text: the tokenizer adds BOS, and a second one degrades output.
For the same reason a leading BOS rendered by a Jinja template or by llama.cpp's format
is removed (llama.cpp's server does the same).

Prefix caching is fastest when rendering [u1] with the generation prompt, then
[u1, a1, u2], gives a string that starts with the first rendering followed by a1's text;
conversation.PromptBuilder checks that per template and falls back to re-tokenizing.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Callable, Mapping

from ..constraints.tool_syntax import HERMES, ToolSyntax, syntax_of_template
from ..core.plan import ChatFormats
from ..core.thinking import markers_in
from ..errors import InvalidRequest
from ..files.whole_file import UnreadableFile, read_text
from ..openai_format import TOOLS_MESSAGE_ROLE, json_kind
from .tool_prompt import fallback_messages, has_tool_turns, say_fallback_once, take_tools, template_reads_tools

ROLES = ("system", "user", "assistant", "tool")

Messages = list[dict]
RenderFn = Callable[[Messages, bool], str]


def validate_messages(messages) -> Messages:
    """A checked copy of `messages`, each content a plain string; InvalidRequest otherwise.

    OpenAI content-part lists of text parts are joined with newlines; other keys
    (name, tool_call_id, ...) are kept for templates that use them.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {role, content} objects")
    checked = []
    tools_messages = 0  # the tools messages a front end put in: the request's own numbering skips them
    for position, message in enumerate(messages):
        i = position - tools_messages
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object with role and content, got {json_kind(message)}")
        role = message.get("role")
        if role == TOOLS_MESSAGE_ROLE:  # a request's tools, for the template (models/tool_prompt.py)
            checked.append(message)
            tools_messages += 1
            continue
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""  # OpenAI's null content (beside tool calls, or our answer whose reasoning never closed)
        checked.append(_reasoning_checked({**message, "content": _content_text(content, i)}, i))
    return checked


def _reasoning_checked(message: dict, index: int) -> dict:
    """An earlier answer's reasoning_content, sent back, is text; null (an answer whose block was
    empty) is left out, as if not sent (a template testing `is defined` would read None)."""
    if "reasoning_content" not in message:
        return message
    reasoning = message["reasoning_content"]
    if reasoning is None:
        return {k: v for k, v in message.items() if k != "reasoning_content"}
    if not isinstance(reasoning, str):
        raise InvalidRequest(f"messages[{index}].reasoning_content must be a string, got {json_kind(reasoning)}")
    return message


def _content_text(content, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise InvalidRequest(f'messages[{index}].content[{j}] must be {{"type": "text", "text": "..."}}')
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string or a list of text parts, got {json_kind(content)}")


class ChatTemplate:
    """A named way to turn messages into a prompt string.

    `source` is the Jinja text, or a description for built-ins. `stop` holds stop
    strings the format needs beyond the model's end-of-generation token (the plain
    transcript has no special tokens, so it needs "\\nUser:"). `fallback_reason` says
    why the GGUF's own template was not used, when it was present but unusable.
    """

    def __init__(self, name: str, source: str, render_fn: RenderFn, stop: tuple[str, ...] = (),
                 fallback_reason: str | None = None, render_tools_fn: Callable[..., str] | None = None,
                 jinja_fn: Callable[..., str] | None = None):
        self.name = name
        # (messages, add_generation_prompt, tools): a Jinja template that reads `tools` (tool_prompt.py)
        self.render_tools_fn = render_tools_fn
        # (messages, add_generation_prompt, tools, variables): a Jinja template, which takes a
        # request's template variables (SamplingParams' chat_template_kwargs, reasoning_effort)
        self.jinja_fn = jinja_fn
        self.source = source
        self.stop = stop
        self.fallback_reason = fallback_reason
        self._render_fn = render_fn

    def render(self, messages, add_generation_prompt: bool = True, variables: dict | None = None) -> str:
        """The prompt; `variables` go to a Jinja template beside the messages (others have none)."""
        checked = validate_messages(messages)
        tools, checked = take_tools(checked)
        try:
            if tools is not None or has_tool_turns(checked):
                if self.render_tools_fn is not None:
                    return self.render_tools_fn(checked, add_generation_prompt, tools, variables)
                say_fallback_once(self.name)
                checked = fallback_messages(checked, tools)
            if variables and self.jinja_fn is not None:
                return self.jinja_fn(checked, add_generation_prompt, None, variables)
            return self._render_fn(checked, add_generation_prompt)
        except InvalidRequest:
            raise
        except Exception as exc:  # a template is user data: any failure is a bad request, not a crash
            raise InvalidRequest(f"chat template {self.name!r} failed: {_one_line(exc)}") from exc

    @property
    def tool_syntax(self) -> ToolSyntax:
        """The call syntax the template teaches; one that does not read tools gets the fallback's (Hermes)."""
        return syntax_of_template(self.source) if self.render_tools_fn is not None else HERMES

    @property
    def thinking(self) -> tuple[str, str] | None:
        """The reasoning block's (opener, closer) a Jinja template writes (core/thinking.py), or None."""
        return markers_in(self.source) if self.jinja_fn is not None else None

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r})"


# --- built-ins ------------------------------------------------------------------------
# llama.cpp's own formats (about 50: llama2, mistral-v7, phi3, deepseek3, chatml, gemma, ...)
# are rendered by llama.cpp itself through a ChatFormats object (core/plan.py; llama.chat_formats.LlamaChatFormats,
# since only llama/ imports llama_cpp). Ours is only `plain`, a
# transcript for base models that have no chat markup at all.

PLAIN = "plain"


_PLAIN_LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


def _render_plain(messages: Messages, add_generation_prompt: bool) -> str:
    def turn(label: str, content: str) -> str:
        # The model continues "Assistant:" with its own leading space; reuse it as
        # generated so the next rendering extends this one byte for byte.
        return f"{label}:{content}" if content[:1] in ("", " ", "\n") else f"{label}: {content}"

    text = "\n\n".join(turn(_PLAIN_LABELS[m["role"]], m["content"]) for m in messages)
    if add_generation_prompt:
        text += "\n\nAssistant:"
    return text


def plain_template() -> ChatTemplate:
    return ChatTemplate(PLAIN, "built-in plain transcript: System: / User: / Assistant:", _render_plain,
                        stop=("\nUser:",))


def builtin_names(formats: ChatFormats | None) -> tuple[str, ...]:
    """Every NAME --chat-template accepts: llama.cpp's formats, then `plain`."""
    return (*(formats.names() if formats else ()), PLAIN)


def llama_cpp_template(name: str, formats: ChatFormats, bos_token: str = "") -> ChatTemplate:
    """llama.cpp's built-in format `name`, rendered by llama.cpp.

    Some formats (llama2's "<s>") write BOS text; the tokenizer adds BOS itself, so a
    leading one is removed as for Jinja templates.
    """
    def render(messages: Messages, add_generation_prompt: bool) -> str:
        prompt = formats.apply(name, messages, add_generation_prompt)
        if prompt is None:
            raise InvalidRequest(f"llama.cpp does not know the chat format {name!r}")
        if bos_token and prompt.startswith(bos_token):
            prompt = prompt[len(bos_token):]
        return prompt

    return ChatTemplate(name, f"built-in {name}: llama.cpp's format, rendered by llama.cpp", render)


def builtin_template(name: str, formats: ChatFormats | None, bos_token: str = "") -> ChatTemplate:
    """The built-in called `name`; InvalidRequest naming the choices when there is none."""
    if name == PLAIN:
        return plain_template()
    if formats is not None and name in formats.names():
        return llama_cpp_template(name, formats, bos_token)
    raise InvalidRequest(f"unknown chat template {name!r}: not a file and not one of {', '.join(builtin_names(formats))}")


# Which llama.cpp format a GGUF without a usable template gets, from its metadata. The
# model's own name is the strongest hint (a Mistral or Llama 2 GGUF has architecture
# `llama`), then the architecture, then the chat markers its vocabulary has as tokens.
# Order matters: the first matching entry wins.
_NAME_HINTS: tuple[tuple[str, str], ...] = (
    ("llama-4", "llama4"), ("llama 4", "llama4"), ("llama4", "llama4"),
    ("llama-3", "llama3"), ("llama 3", "llama3"), ("llama3", "llama3"),
    ("llama-2", "llama2-sys"), ("llama 2", "llama2-sys"), ("llama2", "llama2-sys"),
    ("phi-3", "phi3"), ("phi 3", "phi3"), ("phi3", "phi3"), ("phi-4", "phi4"), ("phi 4", "phi4"), ("phi4", "phi4"),
    ("deepseek-r1", "deepseek3"), ("deepseek r1", "deepseek3"), ("deepseek-v3", "deepseek3"),
    ("deepseek v3", "deepseek3"), ("deepseek-v2", "deepseek2"), ("deepseek v2", "deepseek2"),
    ("deepseek", "deepseek"),
    ("gemma", "gemma"), ("qwen", "chatml"), ("smollm", "chatml"), ("hermes", "chatml"),
    ("command-r", "command-r"), ("command r", "command-r"), ("falcon3", "falcon3"), ("falcon-3", "falcon3"),
    ("falcon 3", "falcon3"), ("vicuna", "vicuna"), ("zephyr", "zephyr"), ("tinyllama", "zephyr"),
    ("openchat", "openchat"), ("granite", "granite"), ("exaone", "exaone3"), ("minicpm", "minicpm"),
    ("chatglm", "chatglm4"), ("glm-4", "chatglm4"), ("gpt-oss", "gpt-oss"), ("kimi-k2", "kimi-k2"),
    ("orion", "orion"), ("megrez", "megrez"), ("gigachat", "gigachat"),
)
_MISTRAL_NAMES = ("mistral", "mixtral", "ministral", "devstral", "magistral")
_ARCH_HINTS: tuple[tuple[str, str], ...] = (  # (architecture prefix, format)
    ("phi3", "phi3"), ("gemma", "gemma"), ("qwen", "chatml"), ("command-r", "command-r"),
    ("cohere", "command-r"), ("deepseek2", "deepseek3"), ("chatglm", "chatglm4"), ("glm4", "chatglm4"),
    ("granite", "granite"), ("exaone4", "exaone4"), ("exaone", "exaone3"), ("minicpm", "minicpm"),
    ("llama4", "llama4"), ("gpt-oss", "gpt-oss"), ("rwkv", "rwkv-world"), ("bailingmoe", "bailing"),
    ("hunyuan-moe", "hunyuan-moe"), ("hunyuan-dense", "hunyuan-dense"), ("seed_oss", "seed_oss"),
    ("grok", "grok-2"), ("mistral3", "mistral-v7-tekken"),
)
_TOKEN_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (  # (tokens that must all exist, format)
    (("<|im_start|>", "<|im_sep|>"), "phi4"), (("<|im_start|>",), "chatml"), (("<start_of_turn>",), "gemma"),
    (("<|start_header_id|>",), "llama3"), (("<|header_start|>",), "llama4"),
    (("<|assistant|>", "<|end|>"), "phi3"), (("<｜Assistant｜>",), "deepseek3"),
    (("<|START_OF_TURN_TOKEN|>",), "command-r"), (("<|start_of_role|>",), "granite"),
    (("<|channel|>", "<|start|>"), "gpt-oss"),
)


def _mistral_format(metadata: dict, has_token: Callable[[str], bool]) -> str:
    # Tekken tokenizers (Nemo, Small 3) drop the space after [INST]; v7 adds [SYSTEM_PROMPT];
    # GGUFs whose vocabulary lacks [INST] as a token are the original v0.1/v0.2 (v1 format).
    tekken = metadata.get("tokenizer.ggml.pre") == "tekken"
    if has_token("[SYSTEM_PROMPT]"):
        return "mistral-v7-tekken" if tekken else "mistral-v7"
    if has_token("[INST]"):
        return "mistral-v3-tekken" if tekken else "mistral-v3"
    return "mistral-v1"


def choose_format(metadata: dict, has_token: Callable[[str], bool] | None = None,
                  available: tuple[str, ...] = ()) -> tuple[str, str]:
    """(format name, why) for a GGUF without a usable chat template: the first hint from
    its name, architecture or vocabulary that names a format in `available`, else plain."""
    has_token = has_token or (lambda _text: False)
    names = [str(metadata.get(k) or "") for k in ("general.name", "general.basename", "general.finetune")]
    for key, value in zip(("general.name", "general.basename", "general.finetune"), names):
        low = value.lower()
        if not low:
            continue
        if any(m in low for m in _MISTRAL_NAMES):
            chosen = _mistral_format(metadata, has_token)
            if chosen in available:
                return chosen, f"{key} {value!r}"
        for hint, chosen in _NAME_HINTS:
            if hint in low and chosen in available:
                return chosen, f"{key} {value!r}"
    arch = str(metadata.get("general.architecture") or "").lower()
    for prefix, chosen in _ARCH_HINTS:
        if arch.startswith(prefix) and chosen in available:
            return chosen, f"general.architecture {arch!r}"
    for tokens, chosen in _TOKEN_HINTS:
        if chosen in available and all(has_token(t) for t in tokens):
            return chosen, f"its vocabulary has {' and '.join(tokens)}"
    return PLAIN, "no name, architecture or chat tokens that llama.cpp's formats match"


# A conversation that tells llama.cpp's formats apart (a system turn, two user turns).
_PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
          {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]


def recognised_format(template_text: str, formats: ChatFormats) -> str | None:
    """The llama.cpp format that llama.cpp itself detects in a Jinja template's text (by its
    markers, as llama_chat_apply_template does), or None when it detects none."""
    detected = formats.apply(template_text, _PROBE, True)
    if detected is None:
        return None
    for name in formats.names():
        if formats.apply(name, _PROBE, True) == detected:
            return name
    return None


# --- Jinja ----------------------------------------------------------------------------


def _generation_tag():
    """`{% generation %}...{% endgeneration %}`: Hugging Face templates mark the assistant's
    text with it (for training masks). Rendering a prompt only needs the text inside."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return GenerationTag


def jinja_template(name: str, text: str, bos_token: str, eos_token: str,
                   tokenizer_adds_bos: bool = True) -> ChatTemplate:
    """Compile `text` in a sandbox; raises InvalidRequest when it does not compile."""
    try:
        from jinja2 import TemplateError

        from .template_budget import BudgetedSandbox, TemplateBudgetExceeded, budget_for, render_within
    except ImportError:
        raise InvalidRequest("rendering a Jinja chat template needs jinja2: pip install jinja2") from None

    def raise_exception(message: str):
        # Templates call this to reject conversations (e.g. roles not alternating).
        raise InvalidRequest(f"chat template {name!r} rejected the messages: {_one_line(message)}")

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    def tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
        # Jinja's own tojson HTML-escapes < > & '; chat templates expect plain JSON
        # (Hugging Face overrides it the same way).
        return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                          ensure_ascii=ensure_ascii)

    # the immutable sandbox plus a step, time and size budget per render (template_budget.py)
    env = BudgetedSandbox(trim_blocks=True, lstrip_blocks=True,
                          extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    env.filters["tojson"] = tojson
    try:
        compiled = env.from_string(text)
    except TemplateError as exc:
        raise InvalidRequest(f"chat template {name!r} does not compile: {_one_line(exc)}") from None

    def render(messages: Messages, add_generation_prompt: bool, tools: list | None = None,
               variables: dict | None = None) -> str:
        context = {**(variables or {}), "messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": bos_token, "eos_token": eos_token}
        if tools is not None:
            context["tools"] = tools  # Hugging Face's convention: absent when the request has none
        try:
            prompt = render_within(env, compiled, context, budget_for(_with_tool_text(messages, tools)))
        except TemplateBudgetExceeded as exc:
            raise TemplateBudgetExceeded(f"chat template {name!r} stopped: {exc}") from None
        if tokenizer_adds_bos and bos_token and prompt.startswith(bos_token):
            prompt = prompt[len(bos_token):]
        return prompt

    return ChatTemplate(name, text, render, render_tools_fn=render if template_reads_tools(text) else None,
                        jinja_fn=render)


def _with_tool_text(messages: Messages, tools: list | None) -> Messages:
    """The messages as the render budget counts them: the tools' and the calls' JSON are input the
    template writes out too (templates_budget.budget_for counts content characters)."""
    extra = [json.dumps(m["tool_calls"], ensure_ascii=False) for m in messages if m.get("tool_calls")]
    if tools:
        extra.append(json.dumps(tools, ensure_ascii=False))
    return [*messages, {"content": "".join(extra)}] if extra else messages


def adds_bos(metadata: Any) -> bool:
    """False where the GGUF says its tokenizer adds no BOS (tokenizer.ggml.add_bos_token, a bool in
    the header, "false" in llama.cpp's metadata strings), as llama.cpp then adds none. A template's
    leading BOS text is then the prompt's own first marker and must stay: SmolLM2's BOS is
    <|im_start|>, and stripping it would start the prompt with a bare "system". Unsaid: True."""
    value = metadata.get("tokenizer.ggml.add_bos_token") if isinstance(metadata, Mapping) else None
    return str(value).lower() != "false"


def from_gguf(template_text: str | None, metadata: dict, bos_token: str, eos_token: str,
              choice: str | None = None, tokenizer_adds_bos: bool = True, formats: ChatFormats | None = None,
              has_token: Callable[[str], bool] | None = None) -> ChatTemplate:
    """Pick the chat template for a model.

    `choice` (from --chat-template) is a built-in NAME (llama.cpp's formats, or plain) or a
    FILE holding a Jinja template. Without it: the GGUF's `tokenizer.chat_template`,
    rendered in our sandbox. When the GGUF has none, or ours cannot use it, llama.cpp's
    format that matches it is used: the one llama.cpp recognises in the template's text,
    else the one the metadata points to (`choose_format`). The result's
    `fallback_reason` then says so in one line, for the CLI to print once.
    """
    if not adds_bos(metadata):
        tokenizer_adds_bos = False
    if choice:
        return _chosen_template(choice, bos_token, eos_token, tokenizer_adds_bos, formats)
    available = builtin_names(formats)
    if template_text:
        try:
            template = jinja_template("gguf", template_text, bos_token, eos_token, tokenizer_adds_bos)
            template.render([{"role": "user", "content": "hi"}])
            return template
        except InvalidRequest as exc:
            problem = f"the GGUF's chat template is unusable ({exc})"
        recognised = recognised_format(template_text, formats) if formats else None
        if recognised:
            fallback = builtin_template(recognised, formats, bos_token)
            fallback.fallback_reason = (f"{problem}; using llama.cpp's built-in {recognised} "
                                        f"(recognised in the template's text)")
            return fallback
    else:
        problem = "the GGUF has no chat template"
    name, why = choose_format(metadata, has_token, available)
    fallback = builtin_template(name, formats, bos_token)
    where = "our" if name == PLAIN else "llama.cpp's"
    fallback.fallback_reason = f"{problem}; chat messages use {where} built-in {name} (from {why})"
    return fallback


def _chosen_template(choice: str, bos_token: str, eos_token: str, tokenizer_adds_bos: bool,
                     formats: ChatFormats | None) -> ChatTemplate:
    if choice in builtin_names(formats):
        return builtin_template(choice, formats, bos_token)
    if os.path.isfile(choice):
        try:
            text = read_text(choice, "chat template file")  # bounded (whole_file)
        except UnreadableFile as exc:
            raise InvalidRequest(f"cannot read chat template file {choice}: {exc.why}") from None
        return jinja_template(choice, text, bos_token, eos_token, tokenizer_adds_bos)
    return builtin_template(choice, formats, bos_token)  # raises: unknown, naming the choices


def _one_line(value) -> str:
    return " ".join(str(value).split()) or type(value).__name__
