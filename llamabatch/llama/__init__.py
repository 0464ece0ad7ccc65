"""The llama.cpp boundary: the runner (the only importer of llama_cpp) and what it needs to know about this CPU."""
