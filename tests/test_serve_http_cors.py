"""--cors-origin: a browser's preflight from a named origin is allowed (before the key check:
a preflight carries no key), and answers carry Access-Control-Allow-Origin; without the flag,
or from another origin, nothing allows it."""
from __future__ import annotations

from http_server import raw, serving

PAGE = "https://app.example.com"
PREFLIGHT = {"Origin": PAGE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_a_named_origin_may_call_the_api_from_a_browser(tmp_path):
    with serving(tmp_path, api_key="sekrit", cors_origins=[PAGE]) as server:
        base = server.base_url.removesuffix("/v1")
        got = raw("OPTIONS", f"{base}/v1/chat/completions", headers=PREFLIGHT)
        assert got.status == 200 and got.headers["access-control-allow-origin"] == PAGE
        assert "POST" in got.headers["access-control-allow-methods"]
        assert "authorization" in got.headers["access-control-allow-headers"].lower()
        answer = raw("GET", f"{base}/v1/models", headers={"Origin": PAGE, "Authorization": "Bearer sekrit"})
        assert answer.status == 200 and answer.headers["access-control-allow-origin"] == PAGE
        # a 401 the page can read, and no way around the key
        refused = raw("GET", f"{base}/v1/models", headers={"Origin": PAGE})
        assert refused.status == 401 and refused.headers["access-control-allow-origin"] == PAGE
        other = raw("OPTIONS", f"{base}/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert other.status == 400 and "access-control-allow-origin" not in other.headers


def test_without_the_flag_no_origin_is_allowed(tmp_path):
    with serving(tmp_path) as server:
        base = server.base_url.removesuffix("/v1")
        got = raw("OPTIONS", f"{base}/v1/chat/completions", headers=PREFLIGHT)
        assert got.status == 405 and "access-control-allow-origin" not in got.headers
        answer = raw("GET", f"{base}/v1/models", headers={"Origin": PAGE})
        assert answer.status == 200 and "access-control-allow-origin" not in answer.headers
