"""GreedyPick (llamabatch/llama/sampling/greedy_pick.py) against llama.cpp's own chain of a logit bias and
greedy, applied to the same candidates: the same token on rows with ties, -inf, NaN and biases of
every sign (no model: llama_sampler_apply works on a candidate array alone)."""
from __future__ import annotations

import ctypes
import math

import numpy as np
from hypothesis import given, strategies as st
from llama_cpp import llama_cpp as C

from llamabatch.llama.sampling.greedy_pick import GreedyPick

N = 12  # a small vocabulary of few values: ties, and biases on the top token, are common


def llama_cpp_pick(logits: np.ndarray, bias: dict[int, float]) -> int:
    """What llama_sampler_sample returns for a chain [logit_bias(bias), greedy] over `logits`."""
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    try:
        if bias:
            arr = (C.llama_logit_bias * len(bias))(*[C.llama_logit_bias(t, b) for t, b in bias.items()])
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_logit_bias(len(logits), len(bias), arr))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
        data = (C.llama_token_data * len(logits))(*[C.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
        cur = C.llama_token_data_array(data, len(logits), -1, False)
        C.llama_sampler_apply(chain, ctypes.byref(cur))
        return int(data[cur.selected].id)
    finally:
        C.llama_sampler_free(chain)


logit = st.one_of(st.sampled_from([0.0, 1.5, 7.25, -3.0, -math.inf]), st.floats(-30, 30, width=32))
bias_value = st.one_of(st.sampled_from([-math.inf, 0.0, 5.75, -5.75]), st.floats(-10, 10, width=32))


@given(st.lists(logit, min_size=N, max_size=N), st.dictionaries(st.integers(0, N - 1), bias_value, min_size=1, max_size=4))
def test_picks_what_llama_cpps_chain_picks(values, bias):
    logits = np.array(values, dtype=np.float32)
    assert GreedyPick(bias).pick(logits) == llama_cpp_pick(logits, bias)


def test_ties_keep_the_first_index_and_a_ban_on_the_top_moves_to_the_next():
    logits = np.array([1.0, 3.0, 0.5, 3.0, 2.0], dtype=np.float32)
    assert GreedyPick({}).pick(logits) == 1 == llama_cpp_pick(logits, {})
    assert GreedyPick({1: -math.inf}).pick(logits) == 3 == llama_cpp_pick(logits, {1: -math.inf})
    assert GreedyPick({3: -1.0}).pick(logits) == 1  # a lower later tie changes nothing: no copy needed
    assert GreedyPick({4: 1.0}).pick(logits) == 1 == llama_cpp_pick(logits, {4: 1.0})  # 2 + 1 ties 3 from above
    assert GreedyPick({0: 2.0}).pick(logits) == 0 == llama_cpp_pick(logits, {0: 2.0})  # 1 + 2 ties 3 from below


def test_a_nan_where_the_pick_lands_is_left_to_the_chain():
    row = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    assert GreedyPick({}).pick(row) is None
    assert GreedyPick({0: math.nan}).pick(np.array([1.0, 0.0], dtype=np.float32)) is None
    assert GreedyPick({}).pick(np.array([1.0, 0.0, 2.0], dtype=np.float32)) == 2
