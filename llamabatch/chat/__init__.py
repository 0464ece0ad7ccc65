"""Multi-turn chat as a library: the conversation and its prompt tokens (conversation.py), a
session generating replies (session.py), the read-eval loop (repl.py) and slash commands, the
saved-conversation database (store.py, saved.py, autosave.py) and each turn's KV (turn_kv.py).
Everything it shows goes through injected callbacks (session.ChatIO); `llamabatch chat` is its CLI."""
