"""Settings given as values rather than layers are made ready in ready.py (`settings_for`:
an EngineConfig a library user wrote; `from_parent`: the settings another process resolved and
sent). The names stay importable here for cluster/worker.py, which imports settings_for from here.
"""
from .ready import from_parent, settings_for

__all__ = ["from_parent", "settings_for"]
