"""The config file, its layer in option resolution, and `llamabatch config`."""
