"""Which CPU kernel path llama.cpp takes, worked out without calling it: which weights ggml
repacks on this CPU (repack_rule.py, mirrored from ggml's sources and read from the GGUF
header), and the verdicts measured once per machine and kept in the cache folder
(machine_verdicts.py). Nothing here imports llama_cpp; llama/ applies these rules.
"""
