"""llama.cpp's built-in chat formats (llama_chat_builtin_templates / llama_chat_apply_template)."""
from __future__ import annotations

import ctypes
import functools

from llama_cpp import llama_cpp as C


class LlamaChatFormats:
    """llama.cpp's built-in chat formats (llama_chat_builtin_templates / llama_chat_apply_template).

    They need no model: a format is picked by name, or detected by llama.cpp from a
    Jinja template's text. chat_template.py chooses which; this class only calls llama.cpp.
    """

    def names(self) -> tuple[str, ...]:
        return _builtin_template_names()

    def apply(self, template: str, messages: list[dict], add_generation_prompt: bool) -> str | None:
        """The prompt llama.cpp renders for `messages` with `template` (a built-in name, or
        Jinja text it recognises by its markers); None when llama.cpp does not know it."""
        encoded = [(str(m["role"]).encode("utf-8"), str(m["content"]).encode("utf-8")) for m in messages]
        chat = (C.llama_chat_message * max(1, len(encoded)))(
            *[C.llama_chat_message(role, content) for role, content in encoded])
        size = 2 * sum(len(r) + len(c) for r, c in encoded) + 1024
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = C.llama_chat_apply_template(template.encode("utf-8"), chat, len(encoded), add_generation_prompt,
                                            buf, size)
            if n < 0:
                return None
            if n < size:  # llama.cpp copies with strncpy: only a shorter result is whole
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        return None


@functools.lru_cache(maxsize=1)
def _builtin_template_names() -> tuple[str, ...]:
    count = C.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * count)()
    C.llama_chat_builtin_templates(out, count)
    return tuple(name.decode("utf-8") for name in out[:count])
