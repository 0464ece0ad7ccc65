"""Prefixes shared between requests: the longest common prefix, the in-memory prefix index, and the disk store's entries as the scheduler sees them."""
