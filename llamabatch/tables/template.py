"""Prompt templates over table rows: Python str.format syntax, each field a column name.

    Classify the sentiment: {review}        {review} is the cell of column "review"
    {{ and }}                               literal braces
    {price:.2f}, {name!r}                   str.format's format specs and conversions work

Only plain column names are fields: `{a.b}`, `{a[0]}`, `{}` and `{0}` are refused when the
template is checked (attribute and index access would reach into Python objects, and
positional fields name no column). Checking happens against the table's columns before
anything runs: an unknown field is one line naming the columns there are.

A template is a user prompt (`text`), optionally with a `system` prompt (both then run as
chat), or a chat `messages` list (JSON: [{"role": ..., "content": "...{col}..."}, ...]) whose
contents are templates.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

from ..files.whole_file import UnreadableFile, read_json, read_text
from .cells import template_value
from .errors import INVALID_ROW, RowProblem, TableError

_FORMATTER = string.Formatter()


def template_fields(text: str, where: str = "the template") -> list[str]:
    """The column names `text` uses, in order of first use. Raises TableError for a field that
    is not a plain column name, or a malformed template."""
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as exc:
        raise TableError(f"{where} is not a valid str.format template: {exc} (write {{{{ and }}}} for "
                         "literal braces)") from None
    names: list[str] = []
    for _literal, name, spec, _conversion in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise TableError(f"{where} has a positional field {{{name}}}: name a column, e.g. {{review}}")
        if any(c in name for c in ".["):
            raise TableError(f"{where} has the field {{{name}}}: fields are plain column names (no . or [])")
        if spec and "{" in spec:
            raise TableError(f"{where} has a nested field in {{{name}:{spec}}}: not supported")
        if name not in names:
            names.append(name)
    return names


@dataclass
class PromptTemplate:
    """What turns a row into a prompt: `text` (a user prompt), with an optional `system`, or
    `messages` (chat messages whose contents are templates)."""

    text: str | None = None
    system: str | None = None
    messages: list[dict] | None = None
    fields: list[str] = field(init=False)

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise TableError("give a prompt template or a messages template (one of them)")
        if self.messages is not None:
            self.messages = check_messages(self.messages)
        names: list[str] = []
        for part, where in self._parts():
            for name in template_fields(part, where):
                if name not in names:
                    names.append(name)
        self.fields = names

    def _parts(self) -> list[tuple[str, str]]:
        if self.messages is not None:
            out = [(m["content"], f"message {i + 1}'s content") for i, m in enumerate(self.messages)]
            if self.system is not None:
                out.insert(0, (self.system, "the system prompt"))
            return out
        out = [(self.text, "the template")]
        if self.system is not None:
            out.append((self.system, "the system prompt"))
        return out

    def check(self, columns: list[str], table: str = "the table") -> None:
        """Refuse fields that name no column, before anything runs."""
        unknown = [f for f in self.fields if f not in columns]
        if unknown:
            raise TableError(f"the template uses {', '.join('{' + f + '}' for f in unknown)}, which "
                             f"{'is not a column' if len(unknown) == 1 else 'are not columns'} of {table}; "
                             f"its columns: {', '.join(columns) if columns else '(none)'}")

    def render(self, cells: dict[str, Any]) -> str | list[dict]:
        """The prompt for one row (text, or chat messages). Raises RowProblem for a missing,
        null or non-text cell that a field uses."""
        values = {}
        for name in self.fields:
            if name not in cells:
                raise RowProblem(INVALID_ROW, f"column {name!r} is missing from this row")
            values[name] = template_value(name, cells[name])
        try:
            if self.messages is not None:
                messages = [{**m, "content": m["content"].format_map(values)} for m in self.messages]
                if self.system is not None and not any(m["role"] == "system" for m in messages):
                    messages.insert(0, {"role": "system", "content": self.system.format_map(values)})
                return messages
            prompt = self.text.format_map(values)
            if self.system is not None:
                return [{"role": "system", "content": self.system.format_map(values)},
                        {"role": "user", "content": prompt}]
            return prompt
        except (ValueError, TypeError) as exc:  # a format spec that does not fit this cell: `{name:.2f}` on text
            raise RowProblem(INVALID_ROW, f"the template does not fit this row: {exc}") from None


def check_messages(messages: Any, where: str = "the messages template") -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise TableError(f"{where} must be a non-empty JSON list of {{\"role\", \"content\"}} objects")
    for i, m in enumerate(messages, start=1):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise TableError(f"{where}: message {i} must be an object with string \"role\" and \"content\"")
    return [dict(m) for m in messages]


def load_messages_template(path: str) -> list[dict]:
    """A JSON file holding the messages list (read bounded: whole_file). Raises TableError."""
    try:
        data = read_json(path, "the messages template")
    except UnreadableFile as exc:
        raise TableError(str(exc)) from None
    return check_messages(data, f"the messages template {path}")


def load_template_file(path: str) -> str:
    """A template file's text (a trailing newline is the file's end, not the prompt's), read
    bounded (whole_file). Raises TableError."""
    try:
        text = read_text(path, "the template file")
    except UnreadableFile as exc:
        raise TableError(str(exc)) from None
    return text[:-1] if text.endswith("\n") else text
