"""llamabatch.tables: reading CSV/TSV/Parquet/Arrow/hf: tables and templating their rows into
prompts, without the CLI or a model. Every bad row is that row's error; every bad table one
TableError line before the first row."""
from __future__ import annotations

import sys

import pytest

from llamabatch.tables import PromptTemplate, TableError, open_table, read_rows
from llamabatch.tables.cells import MAX_CELL_BYTES
from llamabatch.tables.hf_cache import hub_cache_dir

from table_files import damage_row_group, fake_hub, write_csv, write_feather, write_parquet
from lazy_modules import lazy

pa = lazy("pyarrow")
pq = lazy("pyarrow.parquet")


def rows_of(path, template="{text}", **kw):
    return list(read_rows(str(path), template, **kw))


# -- CSV / TSV ------------------------------------------------------------------------------


def test_csv_rows_become_prompts_with_row_numbers_as_ids(tmp_path):
    path = write_csv(tmp_path / "r.csv", 'text,stars\ngreat,5\n"two\nlines",1\n\nbad,2\n')
    rows = rows_of(path, "Review: {text} ({stars} stars)", keep_columns=["stars"])
    assert [(r.row, r.id, r.prompt, r.columns) for r in rows] == [
        (1, 1, "Review: great (5 stars)", {"stars": "5"}),
        (2, 2, "Review: two\nlines (1 stars)", {"stars": "1"}),
        (3, 3, "Review: bad (2 stars)", {"stars": "2"}),  # the blank line is no row
    ]
    assert all(r.ok for r in rows)


def test_tsv_by_extension_and_any_delimiter_by_flag(tmp_path):
    tsv = write_csv(tmp_path / "r.tsv", "text\tn\na,b\t1\n")
    assert [r.prompt for r in rows_of(tsv, "{text}|{n}")] == ["a,b|1"]
    semi = write_csv(tmp_path / "r.txt", "text;n\nx;2\n")
    assert [r.prompt for r in rows_of(semi, "{text}|{n}", delimiter=";")] == ["x|2"]
    assert [r.prompt for r in rows_of(tsv, "{text}", delimiter="\\t")] == ["a,b"]
    with pytest.raises(TableError, match="one character"):
        rows_of(semi, delimiter=";;")


def test_id_column_and_bad_ids(tmp_path):
    path = write_csv(tmp_path / "r.csv", "key,text\nk1,a\n,b\nk3,c\n")
    rows = rows_of(path, id_column="key")
    assert [r.id for r in rows] == ["k1", 2, "k3"]
    assert rows[1].error[0] == "invalid_row" and "id column 'key'" in rows[1].error[1]
    with pytest.raises(TableError, match=r"--id-column 'nope' is not a column .*: key, text"):
        rows_of(path, id_column="nope")


def test_ragged_rows_invalid_utf8_and_big_cells_are_their_rows_errors(tmp_path):
    data = b"text,n\nok,1\ntoo,many,fields\nshort\nbad \xff byte,2\n" + b"x" * 50 + b",3\nlast,4\n"
    path = write_csv(tmp_path / "r.csv", data)
    rows = rows_of(path, "{text}", max_cell_bytes=40)
    assert [r.row for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r.ok for r in rows] == [True, False, False, False, False, True]
    assert "row 2 (line 3) has 3 field(s); the header has 2" in rows[1].error[1]
    assert "row 3 (line 4) has 1 field(s)" in rows[2].error[1]
    assert "column 'text' is not valid UTF-8 (byte 0xff at character 4)" in rows[3].error[1]
    assert "column 'text' holds 0.0 MB, over the 0.0 MB" in rows[4].error[1]
    assert rows[5].prompt == "last"


def test_a_cell_over_the_default_limit_is_refused_and_the_run_goes_on(tmp_path):
    big = "y" * (MAX_CELL_BYTES + 1)
    path = write_csv(tmp_path / "r.csv", f"text\nsmall\n{big}\nafter\n")
    rows = rows_of(path)
    assert [r.ok for r in rows] == [True, False, True]
    assert "over the 16.8 MB a cell may hold" in rows[1].error[1]
    assert rows[1].columns == {}  # the cell is not carried into the record


def test_empty_and_header_only_csv(tmp_path):
    with pytest.raises(TableError, match="is empty: a CSV/TSV input needs a header row"):
        rows_of(write_csv(tmp_path / "e.csv", ""))
    assert rows_of(write_csv(tmp_path / "h.csv", "text,n\n")) == []
    assert open_table(str(tmp_path / "h.csv")).count() == 0


def test_bad_headers_are_one_line(tmp_path):
    with pytest.raises(TableError, match="names a column twice: 'a'"):
        rows_of(write_csv(tmp_path / "d.csv", "a,a\n1,2\n"), "{a}")
    with pytest.raises(TableError, match="empty column name"):
        rows_of(write_csv(tmp_path / "n.csv", "a,\n1,2\n"), "{a}")


def test_bom_is_not_part_of_the_first_column(tmp_path):
    path = write_csv(tmp_path / "b.csv", "\ufefftext\nhi\n")
    assert [r.prompt for r in rows_of(path)] == ["hi"]


def test_count_matches_rows(tmp_path):
    path = write_csv(tmp_path / "r.csv", 'text\na\n\n"b\nc"\nd,e\n')
    assert open_table(str(path)).count() == len(rows_of(path)) == 3


# -- templates ------------------------------------------------------------------------------


def test_unknown_fields_are_refused_before_any_row_naming_the_columns(tmp_path):
    path = write_csv(tmp_path / "r.csv", "review,stars\na,1\n")
    with pytest.raises(TableError) as info:
        read_rows(str(path), "Classify: {reveiw} {stars} {x}")
    assert str(info.value) == ("the template uses {reveiw}, {x}, which are not columns of "
                               f"{path}; its columns: review, stars")


@pytest.mark.parametrize("template, message", [
    ("{}", "positional field"), ("{0}", "positional field"), ("{a.b}", "plain column names"),
    ("{a[0]}", "plain column names"), ("{a", "not a valid str.format template"),
    ("{a:{w}}", "nested field"),
])
def test_template_syntax_errors(template, message):
    with pytest.raises(TableError, match=message):
        PromptTemplate(text=template)


def test_braces_format_specs_and_numbers():
    t = PromptTemplate(text="{{literal}} {price:.2f} {name!r} {flag}")
    assert t.fields == ["price", "name", "flag"]
    assert t.render({"price": 3.14159, "name": "x", "flag": True}) == "{literal} 3.14 'x' true"


def test_system_and_messages_templates(tmp_path):
    path = write_csv(tmp_path / "r.csv", "text,lang\nhello,French\n")
    rows = rows_of(path, "Translate: {text}", system="You translate to {lang}.")
    assert rows[0].prompt == [{"role": "system", "content": "You translate to French."},
                              {"role": "user", "content": "Translate: hello"}]
    messages = [{"role": "user", "content": "Say {text} in {lang}"}]
    rows = list(read_rows(str(path), messages=messages))
    assert rows[0].prompt == [{"role": "user", "content": "Say hello in French"}]
    with pytest.raises(TableError, match="message 1 must be an object"):
        list(read_rows(str(path), messages=[{"role": "user"}]))
    with pytest.raises(TableError, match="one of them"):
        list(read_rows(str(path), "{text}", messages=messages))


def test_a_format_spec_that_does_not_fit_a_cell_is_that_rows_error(tmp_path):
    path = write_csv(tmp_path / "r.csv", "n\n1\n")
    rows = rows_of(path, "{n:.2f}")  # CSV cells are text
    assert rows[0].error[0] == "invalid_row" and "does not fit this row" in rows[0].error[1]


# -- Parquet / Arrow ------------------------------------------------------------------------


def test_parquet_nulls_non_text_and_numbers(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", {
        "text": ["a", None, "c", "d"], "n": [1, 2, 3, 4], "blob": [b"x", b"y", b"z", b"w"],
        "tags": [["p"], ["q"], ["r"], ["s"]]}, row_group_size=2)
    rows = rows_of(path, "{text} {n}", keep_columns="all")
    assert [r.prompt for r in rows] == ["a 1", None, "c 3", "d 4"]
    assert "column 'text' is null" in rows[1].error[1]
    assert rows[0].columns == {"text": "a", "n": 1, "blob": "eA==", "tags": ["p"]}
    assert "column 'blob' is binary, not text" in rows_of(path, "{blob}")[0].error[1]
    assert "column 'tags' is a list, not text" in rows_of(path, "{tags}")[0].error[1]


def test_an_unreadable_row_group_costs_its_rows_only(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", {"text": [f"row {i}" for i in range(30)]}, row_group_size=10)
    damage_row_group(path, 1)
    rows = rows_of(path)
    assert [r.row for r in rows] == list(range(1, 31))
    assert [r.prompt for r in rows[:10] + rows[20:]] == [f"row {i}" for i in list(range(10)) + list(range(20, 30))]
    bad = rows[10:20]
    assert all(r.error[0] == "unreadable_rows" and "row group 1 of" in r.error[1] for r in bad)
    assert all("\n" not in r.error[1] for r in bad)


def test_invalid_utf8_in_a_parquet_string_column(tmp_path):
    raw = pa.array([b"fine", b"bad \xff", b"also fine"], type=pa.binary()).view(pa.string())
    path = tmp_path / "u.parquet"
    pq.write_table(pa.table({"text": raw}), path)
    rows = rows_of(path)
    assert rows[0].prompt == "fine" and rows[2].prompt == "also fine"
    assert rows[1].error[0] == "invalid_row" and "not valid UTF-8" in rows[1].error[1]


def test_a_directory_of_shards_is_one_table_and_a_missing_column_is_a_row_error(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "part-00000.parquet", {"text": ["a", "b"], "extra": ["1", "2"]})
    write_parquet(shards / "part-00001.parquet", {"text": ["c"]})
    (shards / "_SUCCESS").write_text("")
    rows = rows_of(shards, "{text}{extra}")
    assert [(r.row, r.prompt) for r in rows] == [(1, "a1"), (2, "b2"), (3, None)]
    assert "column 'extra' is missing from this row" in rows[2].error[1]
    assert open_table(str(shards)).count() == 3


def test_arrow_and_feather_files(tmp_path):
    for name in ("t.arrow", "t.feather"):
        path = write_feather(tmp_path / name, {"text": ["x", "y"], "n": [1, None]})
        rows = rows_of(path, "{text}-{n}")
        assert [r.prompt for r in rows] == ["x-1", None]
        assert open_table(str(path)).count() == 2


def test_empty_parquet_table(tmp_path):
    path = write_parquet(tmp_path / "e.parquet", {"text": pa.array([], type=pa.string())})
    assert rows_of(path) == []


def test_file_level_problems_are_one_line(tmp_path):
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(TableError, match="cannot read the Parquet file .*junk.parquet"):
        rows_of(tmp_path / "junk.parquet")
    with pytest.raises(TableError, match="No such file"):
        rows_of(tmp_path / "missing.csv")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(TableError, match="no .parquet files"):
        rows_of(tmp_path / "empty_dir")
    (tmp_path / "x.arrow").write_bytes(b"nope")
    with pytest.raises(TableError, match="not an Arrow IPC file"):
        rows_of(tmp_path / "x.arrow")


def test_missing_pyarrow_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "t.parquet", {"text": ["a"]})
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(TableError) as info:
        rows_of(path)
    assert str(info.value) == (f"reading Parquet ({path}) needs pyarrow, which is not installed: "
                               "pip install 'llamabatch[tables]'")
    csv_path = write_csv(tmp_path / "r.csv", "text\nstill works\n")
    assert [r.prompt for r in rows_of(csv_path)] == ["still works"]


# -- Hugging Face hub cache -----------------------------------------------------------------


def test_hub_cache_location_follows_the_hub_variables(tmp_path):
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == "/a"
    assert hub_cache_dir({"HF_HOME": "/b"}) == "/b/hub"
    assert hub_cache_dir({}).endswith("/.cache/huggingface/hub")


def test_hf_dataset_default_config_and_train_split(tmp_path, monkeypatch):
    fake_hub(tmp_path, "acme", "reviews", {
        "data/train-00000-of-00002.parquet": {"text": ["t1", "t2"]},
        "data/train-00001-of-00002.parquet": {"text": ["t3"]},
        "data/test-00000-of-00001.parquet": {"text": ["x1"]},
        "README.md.parquet.txt": {"text": ["ignored"]},
    })
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert [r.prompt for r in rows_of("hf:datasets/acme/reviews")] == ["t1", "t2", "t3"]
    assert [r.prompt for r in rows_of("hf:datasets/acme/reviews:test")] == ["x1"]
    with pytest.raises(TableError, match="no split 'dev' in the cache; splits there: test, train"):
        rows_of("hf:datasets/acme/reviews:dev")


def test_hf_dataset_configs_and_the_parquet_conversion_layout(tmp_path, monkeypatch):
    fake_hub(tmp_path, "acme", "multi", {
        "en/train/0000.parquet": {"text": ["hello"]},
        "en/validation/0000.parquet": {"text": ["val"]},
        "fr/train/0000.parquet": {"text": ["bonjour"]},
    })
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path.parent / tmp_path.name / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "hub").symlink_to(tmp_path)
    assert [r.prompt for r in rows_of("hf:datasets/acme/multi/fr")] == ["bonjour"]
    assert [r.prompt for r in rows_of("hf:datasets/acme/multi/en:validation")] == ["val"]
    with pytest.raises(TableError, match="several configs; name one .*: en, fr"):
        rows_of("hf:datasets/acme/multi")


def test_hf_dataset_not_in_the_cache_is_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TableError, match="acme/absent is not in the local Hugging Face cache .*never downloads"):
        rows_of("hf:datasets/acme/absent")
    with pytest.raises(TableError, match="not a Hugging Face dataset spec"):
        rows_of("hf:acme/absent")


def test_hf_dataset_with_a_missing_blob(tmp_path, monkeypatch):
    fake_hub(tmp_path, "acme", "torn", {"data/train-00000-of-00001.parquet": {"text": ["a"]}})
    for blob in (tmp_path / "datasets--acme--torn" / "blobs").iterdir():
        blob.unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TableError, match="data is missing"):
        rows_of("hf:datasets/acme/torn")
