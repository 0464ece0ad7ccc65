"""`llamabatch serve-stdin`: the JSON-lines co-process."""
