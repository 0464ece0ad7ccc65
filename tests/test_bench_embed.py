"""`llamabatch bench --embed`: embeddings throughput per batch size (tiny, on the bundled
model), and its bad values (no model)."""
from __future__ import annotations

import json

from cli_harness import invoke
from test_bench_cli import bench, header_row

from llamabatch.bench.embed import EMBED_COLUMNS


def test_bench_embed_reports_each_batch_size(tmp_path, model_path):
    out = tmp_path / "embed.json"
    proc = bench("--embed", "--embed-batch", "16,64", "--requests", "6", "--pp", "8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert header_row(proc.stdout, "Batch") == list(EMBED_COLUMNS)
    doc = json.loads(out.read_text())
    levels = doc["embed_levels"]
    assert [lv["n_batch"] for lv in levels] == [16, 64]
    for lv in levels:
        assert lv["inputs"] == 6 and lv["failed"] == 0 and lv["tokens"] == 48 and lv["pooling"] == "mean"
        assert lv["inputs_per_s"] > 0 and lv["tokens_per_s"] > 0
    assert levels[0]["inputs_per_decode"] == 2.0  # 16 tokens a decode: two 8-token inputs
    assert levels[1]["decodes"] == 1  # all six in one decode


def test_bench_embed_bad_values_are_one_line_before_loading():
    result = invoke(["bench", "--embed", "--embed-batch", "8,zero"])
    assert result.exit_code == 2 and "--embed-batch must be a comma-separated list" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
