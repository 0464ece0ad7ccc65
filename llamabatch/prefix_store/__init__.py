"""A disk store of KV-cache prefixes: (token ids, KV bytes) entries that outlive the process.

    store = PrefixStore(root, fingerprint, max_bytes)
    hit = store.lookup(prompt_tokens, min_common=128)
    if hit and (entry := store.load(hit)):
        tokens, payload = entry        # restore payload, keep tokens[:hit.common]
    store.save(tokens, payload)        # queued on a background thread, never blocks

Pure Python, stdlib only: it never imports llama_cpp or the engine.
"""
from .file_format import FORMAT_VERSION
from .store import PrefixStore, StoreHit

__all__ = ["PrefixStore", "StoreHit", "FORMAT_VERSION"]
