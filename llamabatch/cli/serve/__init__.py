"""`llamabatch serve`: the HTTP service's command line."""
