"""Engines, built in one place: settings in, an open EngineAPI out.

    opening.py       open_engine (in this process or supervised) and open_pool (Ray): what callers use
    factory.py       EngineFactory: the one builder of Engine, SupervisedEngine and RayPool
    preparing.py     the model checked and n_parallel "auto" decided, once per engine
    engine.py        Engine: the in-process engine as library users build it, EngineConfig in
    worker_engine.py the engine of the supervised child and of a Ray worker
    runners.py       which runner an engine runs: the model, or one registered by name

Nothing below this layer (core/, llama/, settings/) builds an engine.
"""
from .engine import Engine
from .factory import EngineFactory
from .opening import open_engine, open_pool
from .runners import RunnerChoice, register_runner

__all__ = ["Engine", "EngineFactory", "RunnerChoice", "open_engine", "open_pool", "register_runner"]
