"""`llamabatch chat`: the multi-turn REPL."""
