"""Chat turns kept in the disk prefix store, with the bundled model: a saved conversation
continued by a later engine restores its last turn from disk (the verbose stats say how many
tokens) and answers exactly as the live chat did from KV it had evaluated itself.

The reference is the live chat's own next reply (the same prompt tokens, its history evaluated
in that process), taken before an /undo; the resumed chat then asks the same question. Greedy
tokens are compared as tests/test_prefix_store_model.py does: restored KV sits in other cells,
so a divergence right after a near tie is rounding, not a wrong history.
"""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.chat.autosave import Autosave
from llamabatch.chat.conversation import Conversation
from llamabatch.chat.ollama_stats import parse_stats
from llamabatch.chat.session import ChatIO, ChatSession
from llamabatch.chat.store import Store
from test_prefix_store_model import agree_up_to_near_ties

pytestmark = pytest.mark.model

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2)
FIRST = ("I am planning a long walk along the river next Saturday, starting at the old stone bridge "
         "and ending at the harbour, with a stop at the market for bread, cheese and apples. ") * 12  # past the 512-token window
SECOND = "Which three things should I pack for the walk?"
THIRD = "And what should I do if it rains?"


def session_on(engine, store, tmp_path) -> tuple[ChatSession, list[str]]:
    info: list[str] = []
    session = ChatSession(engine, PARAMS, ChatIO(lambda prompt: "", lambda text: None, info.append, info.append),
                          verbose=True)
    session.autosave = Autosave(store, meta=lambda: {"model": "m", "template": "t", "settings": {}},
                                notice=info.append, fallback_dir=tmp_path)
    return session, info


def test_continue_restores_the_last_turn_and_answers_as_the_live_chat(model_path, tmp_path):
    config = EngineConfig(model=model_path, n_parallel=1, n_ctx=2048, prefix_store=str(tmp_path / "kv"))
    with Engine(config) as engine:
        store = Store(tmp_path / "c.db")
        live, _ = session_on(engine, store, tmp_path)
        live.say(FIRST)
        second = live.say(SECOND)
        reference = live.say(THIRD)  # the history came from this slot's own cache
        assert second.ok and reference.ok and reference.usage.restored_tokens == 0
        assert live.undo()
        store.close()
    with Engine(config) as engine:
        store = Store(tmp_path / "c.db")
        stored = store.read(store.latest_id())
        assert stored.kv_entries[-1] is not None  # the second reply names its prompt's entry
        resumed, info = session_on(engine, store, tmp_path)
        resumed.replace_conversation(Conversation(stored.system, stored.messages), stored)
        again = resumed.say(THIRD)
        store.close()
    assert again.ok
    (block,) = parse_stats("\n".join(info))
    restored = int(block["restored tokens"].split()[0])
    assert restored == second.usage.prompt_tokens  # the whole prompt of the saved turn, from disk
    assert again.usage.prompt_tokens == reference.usage.prompt_tokens  # the very prompt the live chat sent
    assert again.usage.prompt_tokens - again.usage.cached_tokens < 40  # only the new message evaluated
    agree_up_to_near_ties(reference, again)
