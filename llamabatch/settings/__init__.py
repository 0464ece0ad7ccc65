"""Settings, resolved once, below the commands.

    layers.py       flag > LLAMABATCH_* environment > config file > built-in default, per key
    config_file.py  the TOML config file: where it is, what it may hold, each value's file:line
    file_layer.py   the config file that applies, as a layer (and the command-only keys)
    resolved.py     Resolved: the one value a command hands to llamabatch.engines
    ready.py        a Resolved made ready to load, once: the model chosen and checked, the slots decided
                    (also from an EngineConfig, library use, or a parent process's settings)
    slots.py        how n_parallel "auto" is measured, or read from the cache
    context_sizing.py  n_ctx "auto": the KV cache sized from the work when the work is known
    time_bounds.py  the watchdog and drain bounds of run and serve-stdin

Nothing here builds an engine (llamabatch/engines/ does, from a Resolved) or imports the
CLI; the CLI, jobs and Engine(EngineConfig(...)) come here for every setting they need.
"""
