"""GET /health: 503 {"status": "loading"} while the model loads, 200 {"status": "ok"} while the
engine serves, 503 {"status": "restarting"} while its supervised child is started again after a
crash or a hang, never waiting on the engine (nor does /metrics); the API key asked of it unless
the server was started with --health-without-key."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

from llamabatch import EngineConfig, SamplingParams
from llamabatch.engines import open_engine
from llamabatch.serve.http.app import build_app
from llamabatch.serve.http.server import listen
from llamabatch.serve.http.service import Service

import fake_cli
from child_tools import child_env, fake_gguf
from http_server import raw, serving
from supervised_child_runner import HANG, POISON, RESTART_MARK_ENV
from test_serve_http_restart import start_server


def _health(base: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    got = raw("GET", f"{base}/health", headers=headers)
    return got.status, got.json()


def test_health_is_ok_once_serving_and_models_is_unchanged(tmp_path):
    with serving(tmp_path) as server:
        base = server.base_url.removesuffix("/v1")
        assert _health(base) == (200, {"status": "ok"})
        assert [m.id for m in server.client().models.list()] == [server.engine.model_name]


def test_health_says_503_once_the_engine_is_closed(tmp_path):
    with serving(tmp_path) as server:
        base = server.base_url.removesuffix("/v1")
        server.engine.close()
        status, body = _health(base)
        assert status == 503 and body["status"] != "ok"


def test_health_needs_the_key_unless_told_otherwise(tmp_path):
    with serving(tmp_path / "a", api_key="sekrit") as server:
        base = server.base_url.removesuffix("/v1")
        assert _health(base)[0] == 401
        assert _health(base, {"Authorization": "Bearer sekrit"}) == (200, {"status": "ok"})
    with serving(tmp_path / "b", api_key="sekrit", health_without_key=True) as server:
        base = server.base_url.removesuffix("/v1")
        assert _health(base) == (200, {"status": "ok"})
        # only /health is opened: every other route still wants the key
        assert raw("GET", f"{base}/v1/models").status == 401


def test_health_is_503_restarting_while_the_engine_child_restarts_then_ok_again(tmp_path, monkeypatch):
    monkeypatch.setenv(RESTART_MARK_ENV, str(tmp_path / "started-once"))
    proc, client = start_server(tmp_path, tmp_path / "data", "aborts_on_poison_slow_restart",
                                "--api-key", "sekrit", "--health-without-key")
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    seen: list[tuple[int, str, float]] = []
    try:
        assert _health(base) == (200, {"status": "ok"})
        poisoned = threading.Thread(target=lambda: raw(
            "POST", f"{base}/v1/chat/completions",
            b'{"model": "any", "messages": [{"role": "user", "content": "' + POISON.encode() + b'"}]}',
            {"Authorization": "Bearer sekrit", "Content-Type": "application/json"}), daemon=True)
        poisoned.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            started = time.monotonic()
            status, body = _health(base)
            seen.append((status, body["status"], time.monotonic() - started))
            if status == 200 and any(s == 503 for s, _, _ in seen) and not poisoned.is_alive():
                break
            time.sleep(0.02)
        poisoned.join(30)
    finally:
        proc.kill()
        proc.wait(10)
    states = [state for _, state, _ in seen]
    assert "restarting" in states, states
    assert {(s, state) for s, state, _ in seen} <= {(200, "ok"), (503, "restarting")}
    assert states[-1] == "ok"
    # a probe while the child loads (1.5 s a start) is answered at once, not when the load ends
    assert max(took for _, _, took in seen) < 1.0, seen


LOADING = re.compile(r"loading the model; http://127\.0\.0\.1:(\d+)/health")


def test_health_is_503_loading_until_the_model_is_loaded_and_other_routes_say_why(tmp_path):
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "-m", fake_gguf(tmp_path),
            "--n-parallel", "2", "--n-ctx", "512", "--threads", "1", "--prefix-store", "off",
            "--api-key", "sekrit", "--health-without-key"]
    proc = subprocess.Popen([sys.executable, fake_cli.PATH, "loads_in_3s", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    killer = threading.Timer(60, proc.kill)
    killer.start()
    try:
        port = LOADING.search(proc.stderr.readline())
        assert port, "serve did not say where it answers while loading"
        base = f"http://127.0.0.1:{port.group(1)}"
        started = time.monotonic()
        assert _health(base) == (503, {"status": "loading"})
        assert time.monotonic() - started < 1.0  # answered at once, not when the load ends
        chat = raw("POST", f"{base}/v1/chat/completions", b'{"model": "any", "messages": []}',
                   {"Authorization": "Bearer sekrit", "Content-Type": "application/json"})
        assert chat.status == 503 and chat.json()["error"]["code"] == "model_loading"
        assert chat.headers["retry-after"] == "1"
        # the key is asked while loading as after
        assert raw("GET", f"{base}/v1/models").status == 401
        states = []
        while time.monotonic() - started < 30:
            status, body = _health(base)
            states.append(body["status"])
            if status == 200:
                break
            time.sleep(0.05)
        assert states[-1] == "ok" and set(states) == {"loading", "ok"}, states
        models = raw("GET", f"{base}/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert models.status == 200
    finally:
        killer.cancel()
        proc.kill()
        proc.wait(10)


def test_a_hung_engine_child_shows_as_503_and_never_as_a_hung_probe_or_scrape(tmp_path):
    spec = EngineConfig(model=fake_gguf(tmp_path), n_parallel=2, n_ctx=512)
    hanging = fake_cli.RegisteredRunnerEngines("hangs_on_prompt")  # the child's sampling of HANG never returns
    engine = open_engine(spec, SamplingParams(temperature=0, max_tokens=8), factory=hanging,
                         isolated=True, watchdog_s=1.5)
    service = Service(engine, str(tmp_path / "data"))
    listening = listen(build_app(service), "127.0.0.1", 0)
    service.start()
    thread = listening.run_in_thread()
    base = f"http://127.0.0.1:{listening.port}"
    seen: list[tuple[str, float, float]] = []  # (health state, its seconds, the scrape's seconds)
    try:
        assert _health(base) == (200, {"status": "ok"})
        hung = threading.Thread(target=lambda: raw(
            "POST", f"{base}/v1/chat/completions",
            json.dumps({"model": "any", "messages": [{"role": "user", "content": HANG}]}).encode(),
            {"Content-Type": "application/json"}), daemon=True)
        hung.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            started = time.monotonic()
            _, body = _health(base)
            probed = time.monotonic()
            scrape = raw("GET", f"{base}/metrics")
            assert scrape.status == 200
            seen.append((body["status"], probed - started, time.monotonic() - probed))
            states = [s for s, _, _ in seen]
            if "restarting" in states and states[-1] == "ok":
                break
            time.sleep(0.05)
    finally:
        listening.stop()
        thread.join(10)
        service.close(10)
        engine.close(0)
    states = [s for s, _, _ in seen]
    assert "restarting" in states and states[-1] == "ok", states  # the watchdog killed it; a new child serves
    assert max(max(h, m) for _, h, m in seen) < 1.0, seen  # neither waited on the hung child
