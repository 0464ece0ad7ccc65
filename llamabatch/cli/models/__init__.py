"""`llamabatch models`: the GGUFs already on disk and the name to pass to -m for each."""
