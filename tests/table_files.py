"""Small tables for the tables tests: CSV text, Parquet files (with a damaged row group),
Arrow/Feather files and a fake Hugging Face hub cache, all written under tmp_path."""
from __future__ import annotations

import os
from pathlib import Path

from lazy_modules import lazy

pa = lazy("pyarrow")
feather = lazy("pyarrow.feather")
pq = lazy("pyarrow.parquet")


def write_csv(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    return path


def write_parquet(path: Path, columns: dict, row_group_size: int | None = None) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def damage_row_group(path: Path, index: int) -> None:
    """Overwrite row group `index`'s first column chunk: its page header no longer parses."""
    chunk = pq.ParquetFile(path).metadata.row_group(index).column(0)
    data = bytearray(path.read_bytes())
    # the chunk starts at its dictionary page when it has one
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    size = chunk.total_compressed_size
    data[start:start + size] = b"\xff" * size
    path.write_bytes(bytes(data))


def write_feather(path: Path, columns: dict) -> Path:
    feather.write_feather(pa.table(columns), str(path))
    return path


def fake_hub(root: Path, owner: str, name: str, files: dict[str, dict], commit: str = "abc123") -> Path:
    """The hub cache's layout for one dataset: refs/main -> snapshots/<commit>/<files>, each
    file a link into blobs/ as huggingface_hub writes them. `files`: relative path -> columns."""
    repo = root / f"datasets--{owner}--{name}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    blobs = repo / "blobs"
    blobs.mkdir()
    snapshot = repo / "snapshots" / commit
    for i, (rel, columns) in enumerate(files.items()):
        blob = blobs / f"blob{i}"
        write_parquet(blob, columns)
        target = snapshot / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, target.parent), target)
    return root
