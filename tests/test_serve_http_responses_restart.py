"""Stored responses across a `kill -9` of `llamabatch serve` and a restart on the same data dir
and prefix store (real processes, tests/fake_cli.py's "fake" runner): a response is still there
to GET, previous_response_id continues it, and the chain's prefix is restored from the disk
prefix store rather than evaluated (cached_tokens > 0 in usage)."""
from __future__ import annotations

import signal

from test_serve_http_restart import start_server as start_fake_server

# Long enough that the first turn's prompt passes the prefix store's 128-token minimum (the
# fake tokenizes a character a token).
INSTRUCTIONS = "You answer questions about the sea, in one short sentence each. " * 4


def start_server(tmp_path):
    """serve on the fake runner with a disk prefix store (a later --n-ctx and --prefix-store win over
    test_serve_http_restart's own)."""
    return start_fake_server(tmp_path, tmp_path / "data", "fake", "--n-parallel", "2", "--n-ctx", "2048",
                             "--prefix-store", str(tmp_path / "store"))


def test_previous_response_id_continues_across_a_kill_9_reusing_the_prefix(tmp_path):
    proc, client = start_server(tmp_path)
    try:
        first = client.responses.create(model="any", input="What colour is the sea?", instructions=INSTRUCTIONS)
        assert first.usage.input_tokens > 128 and first.usage.input_tokens_details.cached_tokens == 0
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc, client = start_server(tmp_path)
        assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
        second = client.responses.create(model="any", input="And why?", instructions=INSTRUCTIONS,
                                         previous_response_id=first.id)
        events = list(client.responses.create(model="any", input="Thanks.", instructions=INSTRUCTIONS,
                                              previous_response_id=second.id, stream=True))
        third = events[-1].response  # response.incomplete: the fake's reply runs past --max-tokens
    finally:
        proc.kill()
        proc.wait(10)
    assert second.previous_response_id == first.id and second.output_text
    # the first turn's whole prompt came back from the disk prefix store, in a fresh process
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens
    assert not [p for p in (tmp_path / "data" / "responses").iterdir() if p.suffix != ".json"]
