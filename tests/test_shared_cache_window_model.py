"""One KV cache the slots share (kv_unified, serve's default layout), on the bundled models
(both families): a request is answered whatever its neighbours did to the cache. On Gemma 3,
llama.cpp's cell search reuses a window layer's cells that their own sequence no longer sees, so
a neighbour's prompt evaluated into the cells before an idle slot's cached prompt takes that
prompt's early window cells; a later request sharing a short prefix with it must evaluate
instead of cutting the slot back (where a stream per slot would have kept it)."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.model

GREEDY = SamplingParams(max_tokens=6, temperature=0)


def records(first: int, count: int) -> str:
    return " ".join(f"Record {i}: the sensor in room {i % 17} read {i * 37 % 101} degrees." for i in range(first, first + count))


def test_a_request_sharing_a_prefix_whose_window_cells_a_neighbour_took_is_answered(family):
    config = EngineConfig(model=family.path, n_parallel=2, n_ctx=4096, kv_unified=True,
                          share_prefix_min=0, speculative="off")
    with Engine(config) as engine:
        long_text = records(0, 80)  # about 1,300 tokens
        with engine.hold():  # side by side: the short one's cells come first in the cache
            short, long_one = engine.submit("Hi", GREEDY.replace(max_tokens=2)), engine.submit(long_text, GREEDY)
        short, long_one = short.result(timeout=300), long_one.result(timeout=300)
        # an unshared prompt takes the short one's slot (least recently used) and, evaluated from
        # the freed cells on, the long prompt's early window cells after them
        neighbour = engine.generate(["Weather log. " + records(500, 40)], GREEDY)[0]
        shares = long_text[:len(long_text) // 4] + " Summary:"
        shared = engine.generate([shares], GREEDY)[0]
        alone = engine.generate([shares], GREEDY)[0]  # the same prompt again, from its own slot
    results = [short, long_one, neighbour, shared]
    assert [r.error for r in results] == [None] * 4
    assert all(r.finish_reason in ("stop", "length") for r in results)
    if family.sliding_window:
        assert shared.usage.cached_tokens == 0  # its window cells were gone: evaluated, not cut
    else:
        assert shared.usage.cached_tokens > 300  # full attention keeps every cell: the prefix is reused
    assert shared.token_ids == alone.token_ids
