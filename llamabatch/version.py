"""llamabatch's version, in a module of its own: the package root re-exports it, and modules the
root imports lazily (llamabatch.jobs) read it here without importing the root."""
__version__ = "0.1.0"
