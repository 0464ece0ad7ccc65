"""The processes llamabatch starts of itself, by registered name (entries.py)."""
