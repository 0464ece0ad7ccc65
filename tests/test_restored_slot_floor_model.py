"""A slot restored from the disk prefix store past Gemma 3's 512-token window, with the bundled
model: the next request on that slot cuts it back to the restored end and goes on (llama.cpp's
window layers then hold only their last 512 positions, which is all a continuation needs), and
one sharing less of it is evaluated afresh; both answer as evaluated KV does (up to near ties)."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from test_prefix_store_model import agree_up_to_near_ties

pytestmark = pytest.mark.model

TEXT = "The quick brown fox jumps over the lazy dog near the river bank. " * 50  # ~700 tokens
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, logprobs=2, ignore_eos=True)


def test_a_restored_slot_is_cut_back_to_its_restored_end_or_emptied(model_path, tmp_path):
    config = EngineConfig(model=model_path, n_parallel=1, n_ctx=2048, prefix_store=str(tmp_path))
    with Engine(config) as engine:
        prefix = engine.tokenize(TEXT, special=True)
        assert len(prefix) > 600 and engine.save_prefix(prefix).stored_prefix
        prompts = [prefix + engine.tokenize(tail, special=False) for tail in (" And then", " But now")]
        prompts.append(prefix[:500] + engine.tokenize(" Something else", special=False))
        evaluated = [engine.submit(p, PARAMS, stream=False).result(300) for p in prompts]
    with Engine(config) as engine:
        again = [engine.submit(p, PARAMS, stream=False).result(300) for p in prompts]
    assert all(r.ok for r in evaluated + again), [r.error for r in again]
    assert again[0].usage.restored_tokens >= len(prefix)  # (the first engine may have saved a longer shared part)
    assert again[1].usage.cached_tokens >= len(prefix)  # the restored slot, cut back after the first reply
    # shares less than the slot restored: not cut from it (the first engine saved its 500-token
    # shared part, so that entry is restored instead)
    assert again[2].usage.cached_tokens == again[2].usage.restored_tokens
    for a, b in zip(evaluated, again):
        agree_up_to_near_ties(a, b)
