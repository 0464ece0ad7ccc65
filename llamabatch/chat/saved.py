"""Saved conversations as a chat session uses them: the database opened (or why not), the
conversation --continue or --resume names, a session continuing one, and what a new row records."""
from __future__ import annotations

from . import parameters
from .conversation import Conversation
from .session import ChatSession
from .store import Store, StoreError, Stored
from ..errors import ConversationNotFound


def open_store() -> tuple[Store | None, str | None]:
    """The conversation database, or (None, why) when it cannot be used: the chat goes on and
    saves to a JSON file instead (the database is left as it is)."""
    try:
        return Store(), None
    except StoreError as exc:
        return None, str(exc)


def read_stored(latest: bool, resume: int | None) -> Stored | None:
    """The conversation --continue (`latest`) or --resume ID names; ConversationNotFound when there is none."""
    if not latest and resume is None:
        return None
    store = Store(create=False)
    try:
        chosen = store.latest_id() if latest else resume
        stored = store.read(chosen) if chosen is not None else None
    finally:
        store.close()
    if stored is None:
        raise ConversationNotFound("no saved conversation to continue yet" if chosen is None else
                   f"no saved conversation {chosen} (llamabatch chat --list shows them)")
    return stored


def resume_stored(session: ChatSession, stored: Stored, system: str | None) -> None:
    conversation = Conversation(stored.system, stored.messages)
    session.replace_conversation(conversation, stored)  # evaluates it once, in the background
    if system is not None:
        session.set_system(system)
    other = f" (started with {stored.model})" if stored.model and stored.model != session.engine.model_name else ""
    session.io.notice(f"continuing conversation {stored.id}: {len(stored.messages)} messages{other}")


def conversation_meta(session: ChatSession) -> dict:
    """What a new conversation row records besides its messages."""
    return {"model": session.engine.model_name, "template": session.template.name,
            "settings": {"num_ctx": session.num_ctx, **parameters.settings(session.params)}}
