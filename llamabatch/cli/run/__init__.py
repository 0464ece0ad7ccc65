"""`llamabatch run`: a file of prompts through the engine, one record per line."""
