"""Engines, built in one place: settings in, an open EngineAPI out.

    opening.py   open_engine (in this process or supervised) and open_pool (Ray): what callers use
    factory.py   EngineFactory: the one builder of Engine, SupervisedEngine and RayPool

This layer sits above the three kinds of engine it chooses among: in_process/ (the Engine of
this process), supervised/ (a child process runs one) and cluster/ (Ray workers run them).
"""
from ..in_process.engine import Engine
from ..in_process.runners import RunnerChoice, register_runner
from .factory import EngineFactory
from .opening import open_engine, open_pool

__all__ = ["Engine", "EngineFactory", "RunnerChoice", "open_engine", "open_pool", "register_runner"]
