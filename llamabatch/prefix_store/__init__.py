"""A disk store of KV-cache prefixes: (token ids, KV bytes) entries that outlive the process.

    store = PrefixStore(root, fingerprint, max_bytes)
    hit = store.longest_starting(prompt_tokens, min_tokens=128)   # an entry that starts the prompt
    if hit and (entry := store.load(hit)):
        tokens, payload = entry        # restore payload: the slot then holds all of tokens
    store.save(tokens, payload)        # queued on a background thread, never blocks

`lookup` finds the entry sharing the longest prefix instead (its first `hit.common` tokens); the
engine does not use it: a restored Gemma 3 slot cannot be cut shorter (core/plan.Restore).

Pure Python, stdlib only: it never imports llama_cpp or the engine.
"""
from .file_format import FORMAT_VERSION
from .store import PrefixStore, StoreHit

__all__ = ["PrefixStore", "StoreHit", "FORMAT_VERSION"]
