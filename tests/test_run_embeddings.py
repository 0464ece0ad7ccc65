"""`llamabatch run` with embeddings lines, on the scripted fake runner: OpenAI's exact
/v1/embeddings response shape mixed with chat and completion lines, base64, dimensions,
plain {"input"} lines and --embed, and every bad input as that line's error only."""
from __future__ import annotations

import json
import math

import pytest

from llamabatch.openai_format.embed_records import decode_base64
from llamabatch.core.embedding import MAX_INPUTS

from fake_runner import FAKE_N_EMBD, fake_embedding, text_tokens
from test_run_cli import FAKE_MODEL_NAME, llamabatch_run

FAST = ["--n-parallel", "2", "--n-ctx", "512", "--max-tokens", "4", "--temperature", "0", "--no-isolate"]
EMB = "/v1/embeddings"


def emb_line(cid: str, body: dict) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": EMB, "body": {"model": "m", **body}})


def unit(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def records(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        r = json.loads(line)
        out[r.get("custom_id", r.get("id"))] = r
    return out


def test_openai_embeddings_lines_mixed_with_chat_and_completions():
    lines = [
        emb_line("e1", {"input": "hello"}),
        json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}}),
        emb_line("e2", {"input": ["ab", "cde", "ab"], "encoding_format": "base64"}),
        json.dumps({"custom_id": "p1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "xy"}}),
        emb_line("e3", {"input": [[104, 105], [106]], "dimensions": 3}),
    ]
    result = llamabatch_run("-", *FAST, stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    recs = records(result.stdout)
    assert set(recs) == {"e1", "c1", "e2", "p1", "e3"}
    e1 = recs["e1"]
    assert e1["error"] is None and e1["response"]["status_code"] == 200
    body = e1["response"]["body"]
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["object"] == "list" and body["model"] == FAKE_MODEL_NAME
    assert body["data"] == [{"object": "embedding", "index": 0,
                             "embedding": pytest.approx(unit(fake_embedding(text_tokens("hello"), "mean")))}]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    data = recs["e2"]["response"]["body"]["data"]
    assert [d["index"] for d in data] == [0, 1, 2]  # input order kept
    vectors = [decode_base64(d["embedding"]) for d in data]  # little-endian float32
    for text, v in zip(["ab", "cde", "ab"], vectors):
        assert v == pytest.approx(unit(fake_embedding(text_tokens(text), "mean")), abs=1e-6)
    assert recs["e2"]["response"]["body"]["usage"]["prompt_tokens"] == 7
    e3 = recs["e3"]["response"]["body"]["data"]
    assert [len(d["embedding"]) for d in e3] == [3, 3]
    assert e3[0]["embedding"] == pytest.approx(unit(fake_embedding([104, 105], "mean")[:3]))
    assert recs["c1"]["response"]["body"]["object"] == "chat.completion"
    assert recs["p1"]["response"]["body"]["object"] == "text_completion"


@pytest.mark.parametrize("body, fragment", [
    ({"input": ""}, "input is an empty string"),
    ({"input": []}, "input is an empty list"),
    ({"input": ["a", 5.5]}, "input[1] must be a string or a list of token ids"),
    ({"input": [[1, 2], [99999999]]}, "token 99999999 is not a token id"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, f"at most {MAX_INPUTS} per request"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format must be float or base64"),
    ({"input": "a", "dimensions": 0}, "dimensions must be an integer >= 1"),
    ({"input": "a", "dimensions": FAKE_N_EMBD + 1}, "dimensions must be an integer in [1, 8]"),
    ({"input": "a", "temperature": 1}, "unsupported body field 'temperature'"),
    ({"encoding_format": "float"}, "/v1/embeddings needs body.input"),
])
def test_bad_embeddings_line_is_its_own_error(body, fragment):
    lines = [emb_line("bad", body), emb_line("good", {"input": "fine"})]
    result = llamabatch_run("-", *FAST, stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    recs = records(result.stdout)
    assert recs["bad"]["response"]["status_code"] == 400 and recs["bad"]["response"]["body"] is None
    assert fragment in recs["bad"]["error"]["message"]
    assert recs["good"]["error"] is None and len(recs["good"]["response"]["body"]["data"]) == 1


def test_plain_input_lines_and_embed_flag():
    lines = [json.dumps({"id": "a", "input": "hey"}), json.dumps({"id": "b", "input": ["x", "yz"],
                                                                  "encoding_format": "base64"}),
             json.dumps({"id": "c", "input": ""}), json.dumps({"id": "d", "prompt": "gen", "max_tokens": 2})]
    result = llamabatch_run("-", *FAST, stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    recs = records(result.stdout)
    assert recs["a"]["embeddings"][0] == pytest.approx(unit(fake_embedding(text_tokens("hey"), "mean")))
    assert recs["a"]["pooling"] == "mean" and recs["a"]["error"] is None
    assert [len(decode_base64(v)) for v in recs["b"]["embeddings"]] == [FAKE_N_EMBD, FAKE_N_EMBD]
    assert recs["c"]["error"]["code"] == "invalid_request" and recs["c"]["embeddings"] == []
    assert "text" in recs["d"]  # a prompt line still generates without --embed
    text = llamabatch_run("-", *FAST, "--embed", "--input-format", "text", stdin="one\ntwo words\n")
    assert text.returncode == 0, text.stderr
    recs = records(text.stdout)
    assert recs[2]["embeddings"][0] == pytest.approx(unit(fake_embedding(text_tokens("two words"), "mean")))


def test_table_rows_embedded_with_embed_column(tmp_path):
    import csv

    src = tmp_path / "docs.csv"
    src.write_text("doc_id,body\nd1,hello\nd2,\nd3,xyz\n", encoding="utf-8")
    out = tmp_path / "vectors.csv"
    result = llamabatch_run(str(src), *FAST, "--embed-column", "body", "--id-column", "doc_id", "-o", str(out))
    assert result.returncode == 0, result.stderr
    rows = {r["id"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    assert json.loads(rows["d1"]["response"]) == pytest.approx(unit(fake_embedding(text_tokens("hello"), "mean")))
    assert rows["d1"]["prompt_tokens"] == "5"
    assert rows["d2"]["error_code"] == "invalid_request" and "empty" in rows["d2"]["error"]
    assert len(json.loads(rows["d3"]["response"])) == FAKE_N_EMBD
    bad = llamabatch_run(str(src), *FAST, "--embed-column", "nope")
    assert bad.returncode != 0 and "--embed-column 'nope' is not a column" in bad.stderr


def test_dry_run_counts_embedding_inputs_and_no_output_tokens(tmp_path):
    lines = [json.dumps({"id": "e", "input": ["ab", "cde"]}), emb_line("o", {"input": [[5, 6, 7]]}),
             json.dumps({"id": "bad", "input": []}), json.dumps({"id": "p", "prompt": "hi", "max_tokens": 3})]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = llamabatch_run(str(src), "-o", str(tmp_path / "out.jsonl"), *FAST, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["valid"] == 3 and r["invalid_by_code"] == {"invalid_request": 1}
    assert r["prompt_tokens"]["total"] == 5 + 3 + 2  # fake tokenizer: one token per character
    assert r["max_output_tokens"] == 3  # the generation line only
