"""run_frame: pandas and polars DataFrames through a job on the fake runner, one answer per
row in row order, failures in the error column, the frame's own library on the way out."""
from __future__ import annotations

import contextlib

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.errors import InvalidRequest
from llamabatch.jobs import run_frame

from fake_runner import FakeRunner
from lazy_modules import lazy

pandas = lazy("pandas")
polars = lazy("polars")

SLOT_CTX = 64


def engine() -> Engine:
    # The fake answers each prompt with its own text upper-cased (at most max_tokens characters).
    runner = FakeRunner(n_slots=2, slot_ctx=SLOT_CTX, n_batch=64, reply=lambda prompt: prompt.upper())
    return Engine(EngineConfig(n_parallel=2, n_batch=64, chunk_size=16), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=40))


REVIEWS = ["good soup", "cold tea", "x" * (SLOT_CTX + 10), "fine bread", "old cake"]  # the third overflows a slot


def expected(review: str) -> str:
    return f"SAY: {review}".upper()


def test_a_pandas_frame_gets_one_answer_per_row_in_order_and_errors_beside_them():
    frame = pandas.DataFrame({"review": REVIEWS, "stars": [5, 1, 3, 4, 2]}, index=[10, 11, 12, 13, 14])
    with engine() as shared:
        out = run_frame(frame, "Say: {review}", engine=shared, max_inflight=2)
    assert isinstance(out, pandas.DataFrame) and list(out.index) == [10, 11, 12, 13, 14]
    assert list(out.columns) == ["review", "stars", "answer", "error"]
    assert list(frame.columns) == ["review", "stars"]  # the caller's frame is left as it was
    for i, review in enumerate(REVIEWS):
        if i == 2:  # missing values are pandas' own (NaN in a string column)
            assert pandas.isna(out["answer"].iloc[i]) and out["error"].iloc[i].startswith("context_overflow: ")
        else:
            assert out["answer"].iloc[i] == expected(review) and pandas.isna(out["error"].iloc[i])


def test_a_polars_frame_comes_back_as_polars_with_the_answers_column_named():
    frame = polars.DataFrame({"review": REVIEWS, "stars": [5, 1, 3, 4, 2]})
    with engine() as shared:
        out = run_frame(frame, "Say: {review} ({stars} stars)", column="reply", engine=shared)
    assert isinstance(out, polars.DataFrame) and out.columns == ["review", "stars", "reply", "error"]
    replies = out["reply"].to_list()
    assert replies[0] == "SAY: GOOD SOUP (5 STARS)" and replies[4] == "SAY: OLD CAKE (2 STARS)"
    assert replies[2] is None and out["error"].to_list()[2].startswith("context_overflow: ")
    assert out["error"].null_count() == 4


def test_a_prompt_column_is_the_prompt_when_no_template_is_given():
    frame = pandas.DataFrame({"prompt": ["abc", "de"]})
    with engine() as shared:
        out = run_frame(frame, engine=shared)
    assert out["answer"].tolist() == ["ABC", "DE"]


def test_what_run_frame_refuses():
    with engine() as shared:
        with pytest.raises(InvalidRequest, match="pandas or polars DataFrame"):
            run_frame({"review": REVIEWS}, "{review}", engine=shared)
        with pytest.raises(InvalidRequest, match="column 'answer' already"):
            run_frame(pandas.DataFrame({"answer": ["a"]}), "{answer}", engine=shared)
        with pytest.raises(InvalidRequest, match="writes no files of its own: resume"):
            run_frame(pandas.DataFrame({"prompt": ["a"]}), engine=shared, resume=True)


def test_answered_rows_have_none_in_the_error_cell_where_pandas_infers_its_string_dtype():
    # pandas 3 stores a list of strings and None as its string dtype, whose missing value is
    # NaN (true in `if row.error:`); pandas 2 does so with future.infer_string on
    frame = pandas.DataFrame({"review": ["good soup", "x" * (SLOT_CTX + 10)]})
    pandas_3 = int(pandas.__version__.split(".")[0]) >= 3
    inferring = contextlib.nullcontext() if pandas_3 else pandas.option_context("future.infer_string", True)
    with inferring, engine() as shared:
        out = run_frame(frame, "Say: {review}", engine=shared)
    assert out["error"].iloc[0] is None and out["answer"].iloc[0] == expected("good soup")
    assert out["answer"].iloc[1] is None and out["error"].iloc[1].startswith("context_overflow: ")


def test_a_column_of_mixed_types_is_refused_by_name():
    frame = pandas.DataFrame({"stars": [5, 1], "review": ["good soup", 3]})
    with engine() as shared:
        with pytest.raises(InvalidRequest, match=r"column 'review' holds values of 2 types \(int, str\): "
                                                 r"an Arrow column takes one"):
            run_frame(frame, "Say: {review}", engine=shared)
