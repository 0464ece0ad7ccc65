"""The mirror of llama.cpp's batch splitting (kernel_paths/ubatch_split.py) on hand-worked cases;
tests/test_ubatch_split_model.py checks it against llama.cpp itself."""
from llamabatch.kernel_paths.ubatch_split import ubatch_sizes


def test_unified_cuts_the_batch_every_n_ubatch_rows():
    assert ubatch_sizes([(3, 1), (0, 700), (5, 1)], 512, unified=True) == [512, 190]
    assert ubatch_sizes([(0, 1)] * 0, 512, unified=True) == []


def test_streams_decode_rows_of_consecutive_slots_are_one_graph_run():
    assert ubatch_sizes([(s, 1) for s in range(8)], 512, unified=False) == [8]


def test_streams_a_gap_or_a_disorder_in_slot_ids_costs_graph_runs():
    assert ubatch_sizes([(0, 1), (1, 1), (3, 1), (4, 1)], 512, unified=False) == [2, 2]
    assert ubatch_sizes([(2, 1), (0, 1), (1, 1)], 512, unified=False) == [1, 2]


def test_streams_a_mixed_tick_takes_equal_rows_then_the_rest_of_the_prefill():
    # 3 decode rows and a 256-token prefill on consecutive slots: 4 rows, then 255
    assert ubatch_sizes([(0, 1), (1, 1), (2, 1), (3, 256)], 512, unified=False) == [4, 255]
    # two prefills of different lengths: equal rows from both, then the longer one's rest
    assert ubatch_sizes([(0, 100), (1, 300)], 512, unified=False) == [200, 200]
    # n_ubatch bounds the rows per sequence: 512 // 2 = 256 each
    assert ubatch_sizes([(0, 400), (1, 400)], 512, unified=False) == [512, 288]
