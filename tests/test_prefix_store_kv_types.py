"""Disk prefix store entries saved with one KV cache type are never loaded under another, and
the store says why once (prefix_store/other_kv.py). No model: payloads are arbitrary bytes;
the fingerprints differ as the runner's do (llama/kv_state.fingerprint)."""
from __future__ import annotations

import logging

from llamabatch.chat.turn_kv import TurnKV
from llamabatch.prefix_store import PrefixStore
from llamabatch.prefix_store.other_kv import kv_difference

BASE = {"model_sha256": "aa" * 32, "llama_cpp": "0.3.36 state v2", "kv_layout": "stream per slot",
        "swa_full": "True", "n_embd_layers": "640x18", "kernels": "llama.cpp default", "store_format": "1"}
F16 = {**BASE, "cache_types": "f16/f16"}  # V by rows (flash attention): no "v_layout" key
Q8 = {**BASE, "cache_types": "q8_0/q8_0"}
F16_NO_FA = {**BASE, "cache_types": "f16/f16", "v_layout": "transposed (no flash attention)"}
TOKENS = list(range(1, 300))


def saved_entry(root, fingerprint) -> str:
    with PrefixStore(root, fingerprint, 10**8) as store:
        name = store.save(TOKENS, bytes(range(256)) * 40)
        assert name is not None and store.flush(5)
    return name


def test_an_entry_saved_with_f16_is_not_found_nor_loaded_under_q8_0(tmp_path):
    name = saved_entry(tmp_path, F16)
    with PrefixStore(tmp_path, Q8, 10**8) as q8:
        assert q8.longest_starting(TOKENS + [7], 1) is None
        assert q8.load(type("Hit", (), {"name": name})()) is None
        assert q8.tokens_of(name) is None
    with PrefixStore(tmp_path, F16, 10**8) as f16:  # still there for the type it was saved with
        hit = f16.longest_starting(TOKENS + [7], 1)
        assert hit is not None and hit.name == name and f16.load(hit) is not None


def test_the_store_names_the_entries_of_other_kv_settings_in_one_line(tmp_path):
    saved_entry(tmp_path, F16)
    saved_entry(tmp_path, F16_NO_FA)
    saved_entry(tmp_path, Q8)
    with PrefixStore(tmp_path, Q8, 10**8) as q8:
        note = q8.other_kv_note()
    assert "\n" not in note
    assert "1 with KV f16/f16, V by rows (flash attention); 1 with KV f16/f16, V transposed" in note
    assert "not loaded by this engine (KV q8_0/q8_0, V by rows (flash attention))" in note
    with PrefixStore(tmp_path, F16, 10**8) as f16:  # its own entries are not "other"
        note = f16.other_kv_note()
    assert "(1 with KV f16/f16, V transposed (no flash attention); 1 with KV q8_0/q8_0" in note


def test_entries_of_another_model_are_not_called_a_kv_type_mismatch(tmp_path):
    saved_entry(tmp_path, {**F16, "model_sha256": "bb" * 32})
    with PrefixStore(tmp_path, Q8, 10**8) as q8:
        assert q8.other_kv_note() is None
    assert kv_difference({**F16, "model_sha256": "bb" * 32}, Q8) is None
    assert kv_difference(F16, F16) is None


def test_a_chat_turn_saved_with_f16_is_evaluated_under_q8_0_and_says_why_once(tmp_path, caplog):
    name = saved_entry(tmp_path, F16)
    with PrefixStore(tmp_path, Q8, 10**8) as q8:
        turns = TurnKV(q8, 128)
        with caplog.at_level(logging.WARNING, logger="llamabatch.chat"):
            assert turns.tokens_of(name) is None
            assert turns.tokens_of(name) is None
    (record,) = caplog.records
    assert record.getMessage() == ("chat: the saved KV was written with KV f16/f16, V by rows (flash attention); "
                                   "this engine runs KV q8_0/q8_0, V by rows (flash attention): not loaded, "
                                   "evaluated instead")
    with PrefixStore(tmp_path, F16, 10**8) as f16:
        assert TurnKV(f16, 128).tokens_of(name) == TOKENS
