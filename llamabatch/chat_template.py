"""Rendering chat messages to a prompt: the GGUF's own Jinja template, or a named built-in.

Built-ins never emit BOS text: the tokenizer adds BOS, and a second one degrades output.
For the same reason a leading BOS rendered by a Jinja template is removed (llama.cpp's
server does the same).

Every built-in keeps one property that prefix caching depends on: rendering
[u1] with the generation prompt, then [u1, a1, u2], gives a string that starts with the
first rendering followed by a1's text, so turn 1's KV cache is reused as-is.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Callable

from .errors import InvalidRequest

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
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object with role and content, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        checked.append({**message, "content": _content_text(message.get("content"), i)})
    return checked


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
    raise InvalidRequest(f"messages[{index}].content must be a string or a list of text parts, got {type(content).__name__}")


class ChatTemplate:
    """A named way to turn messages into a prompt string.

    `source` is the Jinja text, or a description for built-ins. `stop` holds stop
    strings the format needs beyond the model's end-of-generation token (the plain
    transcript has no special tokens, so it needs "\\nUser:"). `fallback_reason` says
    why the GGUF's own template was not used, when it was present but unusable.
    """

    def __init__(self, name: str, source: str, render_fn: RenderFn, stop: tuple[str, ...] = (),
                 fallback_reason: str | None = None):
        self.name = name
        self.source = source
        self.stop = stop
        self.fallback_reason = fallback_reason
        self._render_fn = render_fn

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        checked = validate_messages(messages)
        try:
            return self._render_fn(checked, add_generation_prompt)
        except InvalidRequest:
            raise
        except Exception as exc:  # a template is user data: any failure is a bad request, not a crash
            raise InvalidRequest(f"chat template {self.name!r} failed: {_one_line(exc)}") from exc

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r})"


# --- built-ins ------------------------------------------------------------------------


def _render_gemma(messages: Messages, add_generation_prompt: bool) -> str:
    # Gemma has no system role: its official template prepends the system text to the
    # first user turn. A system message with no user turn after it becomes a user turn
    # of its own rather than being dropped.
    system_prefix = ""
    if messages[0]["role"] == "system" and len(messages) > 1 and messages[1]["role"] == "user":
        system_prefix = messages[0]["content"] + "\n\n"
        messages = messages[1:]
    parts = []
    for i, message in enumerate(messages):
        role = "model" if message["role"] == "assistant" else "user"
        prefix = system_prefix if i == 0 else ""
        parts.append(f"<start_of_turn>{role}\n{prefix}{message['content'].strip()}<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _render_chatml(messages: Messages, add_generation_prompt: bool) -> str:
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _render_llama3(messages: Messages, add_generation_prompt: bool) -> str:
    def header(role: str) -> str:
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n"

    # Llama 3.1 calls tool results "ipython".
    parts = [header("ipython" if m["role"] == "tool" else m["role"]) + m["content"].strip() + "<|eot_id|>"
             for m in messages]
    if add_generation_prompt:
        parts.append(header("assistant"))
    return "".join(parts)


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


def gemma_template() -> ChatTemplate:
    return ChatTemplate("gemma", "built-in gemma: <start_of_turn>user/model ... <end_of_turn>", _render_gemma)


def chatml_template() -> ChatTemplate:
    return ChatTemplate("chatml", "built-in chatml: <|im_start|>role ... <|im_end|>", _render_chatml)


def llama3_template() -> ChatTemplate:
    return ChatTemplate("llama3", "built-in llama3: <|start_header_id|>role<|end_header_id|> ... <|eot_id|>",
                        _render_llama3)


def plain_template() -> ChatTemplate:
    return ChatTemplate("plain", "built-in plain transcript: System: / User: / Assistant:", _render_plain,
                        stop=("\nUser:",))


BUILTIN_TEMPLATES: dict[str, Callable[[], ChatTemplate]] = {
    "gemma": gemma_template,
    "chatml": chatml_template,
    "llama3": llama3_template,
    "plain": plain_template,
}


def builtin_for_architecture(architecture: str | None) -> ChatTemplate:
    """The built-in closest to a GGUF's `general.architecture`; `plain` when unknown."""
    arch = (architecture or "").lower()
    if arch.startswith("gemma"):
        return gemma_template()
    if arch.startswith("qwen"):
        return chatml_template()
    if arch == "llama":
        # A guess: GGUFs of Llama 3 chat models normally ship their own template,
        # so this only fires for files converted without one.
        return llama3_template()
    return plain_template()


# --- Jinja ----------------------------------------------------------------------------


def jinja_template(name: str, text: str, bos_token: str, eos_token: str,
                   tokenizer_adds_bos: bool = True) -> ChatTemplate:
    """Compile `text` in a sandbox; raises InvalidRequest when it does not compile."""
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
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

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    env.filters["tojson"] = tojson
    try:
        compiled = env.from_string(text)
    except TemplateError as exc:
        raise InvalidRequest(f"chat template {name!r} does not compile: {_one_line(exc)}") from None

    def render(messages: Messages, add_generation_prompt: bool) -> str:
        prompt = compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                 bos_token=bos_token, eos_token=eos_token)
        if tokenizer_adds_bos and bos_token and prompt.startswith(bos_token):
            prompt = prompt[len(bos_token):]
        return prompt

    return ChatTemplate(name, text, render)


def from_gguf(template_text: str | None, architecture: str | None, bos_token: str, eos_token: str,
              choice: str | None = None, tokenizer_adds_bos: bool = True) -> ChatTemplate:
    """Pick the chat template for a model.

    `choice` (from --chat-template) is a built-in NAME or a FILE holding a Jinja
    template. Without it: the GGUF's `tokenizer.chat_template`, else the built-in that
    matches `architecture`. A GGUF template that cannot be used (does not compile, or
    fails on a one-message conversation) falls back to the built-in, and says why in
    `fallback_reason`, because a model should still run with a slightly off template.
    """
    if choice:
        return _chosen_template(choice, bos_token, eos_token, tokenizer_adds_bos)
    if template_text:
        try:
            template = jinja_template("gguf", template_text, bos_token, eos_token, tokenizer_adds_bos)
            template.render([{"role": "user", "content": "hi"}])
            return template
        except InvalidRequest as exc:
            fallback = builtin_for_architecture(architecture)
            fallback.fallback_reason = f"the GGUF's chat template is unusable ({exc}); using built-in {fallback.name}"
            return fallback
    return builtin_for_architecture(architecture)


def _chosen_template(choice: str, bos_token: str, eos_token: str, tokenizer_adds_bos: bool) -> ChatTemplate:
    if choice in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[choice]()
    if os.path.isfile(choice):
        try:
            with open(choice, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"cannot read chat template file {choice}: {_one_line(exc)}") from None
        return jinja_template(choice, text, bos_token, eos_token, tokenizer_adds_bos)
    names = ", ".join(BUILTIN_TEMPLATES)
    raise InvalidRequest(f"unknown chat template {choice!r}: not a file and not one of {names}")


def _one_line(value) -> str:
    return " ".join(str(value).split()) or type(value).__name__
