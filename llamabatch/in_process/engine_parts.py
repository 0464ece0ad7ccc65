"""What the core engine is handed by the layer that builds it: where chat templates come from
(models/chat_template.py) and the disk prefix store (prefix_store/), opened for its runner.
core/ imports neither; an Engine built here gets both (engine.py).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from ..config import EngineConfig
from ..core.prefixes.disk_prefix import DiskPrefixes

log = logging.getLogger("llamabatch.prefix_store")


class GgufChatTemplates:
    """core.inputs.ChatTemplates over models/chat_template.py: the GGUF's template, a chosen
    built-in or Jinja file, or a fallback."""

    def choose(self, runner: Any, choice: str | None, has_token: Callable[[str], bool]) -> Any:
        from ..models.chat_template import from_gguf

        meta = runner.metadata
        return from_gguf(meta.get("tokenizer.chat_template"), meta, bos_token=runner.bos_text,
                         eos_token=runner.eos_text, choice=choice, formats=runner.chat_formats, has_token=has_token)

    def validate(self, messages: Sequence[dict]) -> list[dict]:
        from ..models.chat_template import validate_messages

        return validate_messages(messages)


def open_disk_prefixes(config: EngineConfig, runner: Any) -> DiskPrefixes | None:
    """The store `config.prefix_store` names, for this runner's KV; None when it is off, the
    runner cannot restore slots exactly (deterministic mode, a memory that cannot be cut), or
    the folder cannot be used (said once in the log: generation does not need it)."""
    if not config.prefix_store or not config.prefix_store_max_bytes or not config.cache_prompt:
        return None
    if not runner.capabilities.can_store:
        return None
    from ..prefix_store import FORMAT_VERSION, PrefixStore

    # the file format's version too: another version's entries then live in a folder of their own
    fingerprint = {**runner.kv_fingerprint, "store_format": str(FORMAT_VERSION)}
    try:
        store = PrefixStore(config.prefix_store, fingerprint, config.prefix_store_max_bytes)
    except OSError as exc:
        log.warning("prefix store %s is not usable (%s): running without it", config.prefix_store, exc)
        return None
    note = store.other_kv_note()
    if note:
        log.warning("%s", note)  # once, as the store opens: those entries are never looked up
    return DiskPrefixes(store)
