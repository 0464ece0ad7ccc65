"""OpenAI's documented body fields that cannot change a local answer: accepted, and named in the
record's `ignored_fields` (a batch line) or the `LlamaBatch-Ignored-Fields` header (online), so
a client can see they did nothing. A documented field that would change the answer and cannot be
honoured (audio output, web search, any modality but text) is refused naming it; a field OpenAI
does not document stays an error (lines.py), as OpenAI's own API answers it.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest

# Accepted without a word: every request names a model (the loaded one answers), and
# stream_options is read by serve's online path.
SILENT_FIELDS = ("model", "stream_options")
# Accepted and named: bookkeeping and routing hints of OpenAI's service with no local effect.
NOTED_FIELDS = ("user", "metadata", "store", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
                "verbosity")
# Chat fields that would ask for something else than text: refused unless absent or off.
REFUSED_CHAT_FIELDS = ("audio", "web_search_options")
HEADER = "LlamaBatch-Ignored-Fields"


def noted_fields(body: dict[str, Any], chat: bool) -> list[str]:
    """The body's fields accepted with no effect, in body order; InvalidRequest for a documented
    field asking for what cannot be given."""
    noted = []
    for key, value in body.items():
        if value is None:
            continue
        if key in NOTED_FIELDS:
            noted.append(key)
        elif chat and key == "modalities":
            if value != ["text"]:
                raise InvalidRequest(f'body.modalities must be ["text"] (only text is generated here), '
                                     f"got {json.dumps(value)}")
            noted.append(key)
        elif chat and key in REFUSED_CHAT_FIELDS:
            raise InvalidRequest(f"body.{key} is not supported: only text is generated here, with no web access")
    return noted


def is_accepted(key: str, chat: bool) -> bool:
    """Whether request_body.map_body skips the key as read here (silent, noted, or checked by noted_fields)."""
    return key in SILENT_FIELDS or key in NOTED_FIELDS or (chat and key in ("modalities", *REFUSED_CHAT_FIELDS))


def header_for(fields: Any) -> dict[str, str]:
    """The online answer's header naming its ignored fields (none when there are none)."""
    return {HEADER: ", ".join(fields)} if fields else {}
