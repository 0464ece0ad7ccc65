"""Settings, resolved once, below the commands.

    layers.py       flag > LLAMABATCH_* environment > config file > built-in default, per key
    config_file.py  the TOML config file: where it is, what it may hold, each value's file:line
    file_layer.py   the config file that applies, as a layer (and the command-only keys)
    resolved.py     Resolved: the one value a command hands to the engine factory
    model.py        the model a setting names: its file, display name and default stops (once)
    slots.py        n_parallel "auto" made a count (once), by measuring or from the cache
    loading.py      the runner for resolved settings (the only place a model is loaded from them)
    factory.py      EngineFactory: resolved settings -> an Engine or a SupervisedEngine

Nothing here imports the CLI; the CLI (and Engine(EngineConfig(...)) for library users)
comes here for every setting it needs.
"""
