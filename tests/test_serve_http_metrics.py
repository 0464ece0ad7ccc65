"""GET /metrics: Prometheus' text format read by prometheus_client's own parser, the documented
names present, counters and histograms that move with chat and completion requests (the fake
runner), a batch's lines done of all while it runs, and the API key asked of it as of every route."""
from __future__ import annotations

import re
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from http_server import CHAT, COMPLETIONS, batch_file, ended, raw, serving, wait_batch

DOCS = Path(__file__).resolve().parent.parent / "docs" / "serve.md"


def _scrape(base: str, headers: dict[str, str] | None = None) -> dict[str, list]:
    """Every sample by its name (counters keep their _total, histograms their _bucket/_count/_sum)."""
    got = raw("GET", f"{base}/metrics", headers=headers)
    assert got.status == 200, got.body
    assert got.headers["content-type"].startswith("text/plain")
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(got.body.decode("utf-8")):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _value(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def _documented_names() -> list[str]:
    """The names in docs/serve.md's Metrics table, as a scrape shows them."""
    section = DOCS.read_text(encoding="utf-8").split("## Metrics", 1)[1].split("\n## ", 1)[0]
    return sorted(set(re.findall(r"^\| `(llamabatch:[a-z_:]+)`", section, flags=re.M)))


def test_every_documented_name_is_scraped_with_vllms_buckets(tmp_path):
    names = _documented_names()
    assert len(names) >= 20
    with serving(tmp_path) as server:
        base = server.base_url.removesuffix("/v1")
        server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "question 1"}])
        samples = _scrape(base)
    histograms = {n.removesuffix("_bucket") for n in samples if n.endswith("_bucket")}
    for name in names:
        shown = f"{name}_bucket" if name in histograms else name
        if name.startswith("llamabatch:batch_"):
            continue  # per batch: only while a batch is unfinished (test_a_batchs_lines_done_move_while_it_runs)
        assert shown in samples, f"{name} documented, not scraped"
    ttft = [s.labels["le"] for s in samples["llamabatch:time_to_first_token_seconds_bucket"]]
    assert ttft[:3] == ["0.001", "0.005", "0.01"] and ttft[-2:] == ["2560.0", "+Inf"]
    e2e = [s.labels["le"] for s in samples["llamabatch:e2e_request_latency_seconds_bucket"]]
    assert e2e[0] == "0.3" and e2e[-2] == "7680.0" and len(e2e) == 22


def test_counters_and_histograms_move_with_requests(tmp_path):
    with serving(tmp_path) as server:
        base = server.base_url.removesuffix("/v1")
        client = server.client()
        before = _scrape(base)
        assert _value(before, "llamabatch:http_requests_total") == 0
        for n in range(3):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"question {n}"}])
        client.completions.create(model="m", prompt="question 7")
        refused = raw("POST", f"{server.base_url}/chat/completions", b'{"model": "m"}',
                      {"Content-Type": "application/json"})
        assert refused.status == 400
        after = _scrape(base)
    assert _value(after, "llamabatch:http_requests_total", endpoint=CHAT, outcome="stop") == 3
    assert _value(after, "llamabatch:http_requests_total", endpoint=COMPLETIONS, outcome="stop") == 1
    assert _value(after, "llamabatch:http_requests_total", endpoint=CHAT, outcome="refused") == 1
    assert _value(after, "llamabatch:engine_requests_total", outcome="finished") == 4
    for name in ("llamabatch:prompt_tokens_total", "llamabatch:generation_tokens_total"):
        assert _value(after, name) > _value(before, name) == 0
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert _value(after, f"llamabatch:{name}_count") == 4
        assert _value(after, f"llamabatch:{name}_sum") > 0
        assert _value(after, f"llamabatch:{name}_bucket", le="+Inf") == 4
    assert _value(after, "llamabatch:slots") == 4
    assert _value(after, "llamabatch:num_requests_running") == 0
    # the slots keep their last requests' tokens (the prefix cache): cells in use, within the budget
    assert _value(before, "llamabatch:kv_cells_used") == 0
    assert 0 < _value(after, "llamabatch:kv_cells_used") <= _value(after, "llamabatch:kv_cells_budget")


def test_a_batchs_lines_done_move_while_it_runs(tmp_path):
    with serving(tmp_path, step_delay=0.01) as server:
        base = server.base_url.removesuffix("/v1")
        client = server.client()
        uploaded = client.files.create(file=("in.jsonl", batch_file(24)), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
        seen: list[tuple[float, float]] = []
        speeds: list[float] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ended(client.batches.retrieve(batch.id)):
            samples = _scrape(base)
            done = _value(samples, "llamabatch:batch_lines_done", batch_id=batch.id)
            total = _value(samples, "llamabatch:batch_lines", batch_id=batch.id)
            if total:
                seen.append((done, total))
            speeds += [s.value for s in samples.get("llamabatch:batch_generation_tokens_per_second", [])
                       if s.labels["batch_id"] == batch.id]
            time.sleep(0.05)
        finished = wait_batch(client, batch.id, ended)
        assert finished.status == "completed"
        gone = _scrape(base)  # an ended batch leaves /metrics; its figures stay in GET /v1/batches/{id}
    assert {total for _, total in seen} == {24}
    assert any(0 < done < 24 for done, _ in seen), seen
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert any(speed > 0 for speed in speeds)
    assert _value(gone, "llamabatch:batch_lines", batch_id=batch.id) == 0


def test_metrics_need_the_key_even_with_health_without_key(tmp_path):
    with serving(tmp_path, api_key="sekrit", health_without_key=True) as server:
        base = server.base_url.removesuffix("/v1")
        assert raw("GET", f"{base}/metrics").status == 401
        assert raw("GET", f"{base}/health").status == 200
        assert "llamabatch:slots" in _scrape(base, {"Authorization": "Bearer sekrit"})


def test_two_servers_in_one_process_keep_their_own_figures(tmp_path):
    with serving(tmp_path / "a") as first, serving(tmp_path / "b") as second:
        first.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "question 1"}])
        a = _scrape(first.base_url.removesuffix("/v1"))
        b = _scrape(second.base_url.removesuffix("/v1"))
    assert _value(a, "llamabatch:http_requests_total") == 1
    assert _value(b, "llamabatch:http_requests_total") == 0
