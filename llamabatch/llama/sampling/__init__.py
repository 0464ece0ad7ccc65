"""Sampling a logits row in llama.cpp: sampler chains, grammar masks (llguidance and llama.cpp's GBNF), greedy picks in place, rows sampled apart, logprobs."""
