"""The engine of this process, and what every process that runs an engine needs to build one.

    engine.py         Engine: the in-process engine as library users build it, EngineConfig in
    runners.py        which runner an engine runs: the model, or one registered by name
    engine_parts.py   what the core engine is handed from above it: chat templates, the disk prefix store
    worker_engine.py  the engine of the supervised child and of a Ray worker

supervised/ and cluster/ sit above this package (their children and workers build an Engine
here); engines/ (the factory that chooses among all three) sits above them.
"""
