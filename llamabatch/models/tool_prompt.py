"""Tools and tool turns on their way into a chat template.

The engine renders messages alone, so a request's tools come as a first pseudo-message
(openai_format/tools_request.TOOLS_MESSAGE_ROLE); `take_tools` takes it out. A template that
reads `tools` (Hugging Face's convention: its text names them, as Qwen's and Hermes' do) gets
them as the `tools` variable and the tool turns as they are (assistant `tool_calls`, role
`tool`). Any other template gets the fallback, said once on stderr:

- the tools described in the system turn (the first system message gets them appended, or one
  is added), with the call format the engine constrains and parses: Hermes'
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- an assistant turn's calls written into its content in that format;
- tool results as a user turn of `<tool_response>` blocks (consecutive results in one turn,
  so templates that insist on user/assistant alternation, like Gemma's, still render).
"""
from __future__ import annotations

import json
import re
import sys
import threading

from ..openai_format import TOOLS_MESSAGE_ROLE

_NAMES_TOOLS = re.compile(r"\btools\b")
_said: set[str] = set()
_said_lock = threading.Lock()

FALLBACK_INTRO = ("You may call one or more functions to help with the user's request. The functions, "
                  "as JSON schemas, are within <tools></tools>:\n<tools>\n")
FALLBACK_CALL_FORMAT = ("\n</tools>\nTo call a function, answer with a JSON object of its name and arguments "
                        "within <tool_call></tool_call> tags:\n<tool_call>\n"
                        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def template_reads_tools(text: str | None) -> bool:
    """Whether a Jinja template's text uses `tools` (then it gets them, and tool turns, as they are)."""
    return bool(text) and bool(_NAMES_TOOLS.search(text))


def take_tools(messages: list[dict]) -> tuple[list | None, list[dict]]:
    """(the tools of the pseudo-message or None, the messages without it)."""
    tools = None
    rest = []
    for message in messages:
        if message.get("role") == TOOLS_MESSAGE_ROLE:
            tools = message.get("tools") or None
        else:
            rest.append(message)
    return tools, rest


def has_tool_turns(messages: list[dict]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def say_fallback_once(template_name: str) -> None:
    with _said_lock:
        if template_name in _said:
            return
        _said.add(template_name)
    print(f"llamabatch: chat template {template_name!r} does not read tools; they are described in a system "
          "turn and calls use <tool_call> tags (docs/tools.md)", file=sys.stderr, flush=True)


def fallback_messages(messages: list[dict], tools: list | None) -> list[dict]:
    """The messages for a template without tool support (see the module's docstring)."""
    out: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = "\n".join(_call_text(call) for call in message["tool_calls"])
            content = message.get("content") or ""
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(message)
    out = [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
    if tools:
        described = FALLBACK_INTRO + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + FALLBACK_CALL_FORMAT
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}" if out[0]["content"] else described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _call_text(call: dict) -> str:
    function = call.get("function") or {}
    body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"
