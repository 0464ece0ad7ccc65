"""The engine core: scheduling, sequences, the tick loop. Never imports llama_cpp."""
