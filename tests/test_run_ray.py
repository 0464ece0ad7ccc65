"""`llamabatch run --ray` end to end: real Ray, real engines on the bundled model.

One Ray head for the module (2 CPUs, loopback only, its own token), started with
`ray start --block` in a session of its own and stopped by signalling that one process;
every process it started must be gone afterwards. Runs are small (4 slots x 256 tokens,
a few tokens per line) so the module stays around a minute on 2 cores.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

SLOTS = ["--n-parallel", "4", "--n-ctx", "1024", "--temperature", "0"]
TWO_WORKERS = ["--ray-workers", "2", "--ray-cpus-per-worker", "1"]
CHAT = "/v1/chat/completions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def ray_env():
    """Environment for Ray processes of this module: loopback only, token auth with a token of our own."""
    tmp = Path(tempfile.mkdtemp(prefix="lbray"))  # short: Ray's socket paths live under it
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0")
    env.pop("LLAMABATCH_MODEL", None)
    yield env, tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(ray_env, model_path):
    """A Ray head with 2 CPUs for the whole module; its address."""
    env, tmp = ray_env
    port = _free_port()
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(port),
         "--num-cpus", "2", "--include-dashboard", "false", "--temp-dir", str(tmp / "ray"),
         "--ray-client-server-port", str(_free_port()), "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not (tmp / "ray" / "session_latest" / "logs" / "raylet.out").exists() or not _ready(env, address):
            assert head.poll() is None, f"ray start failed: {head.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the Ray head did not come up in 300 s"
            time.sleep(0.5)
        yield address
    finally:
        family = _descendants(head.pid)
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops everything it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in family if _alive(p)]
        for p in left:  # only processes this fixture started, by id
            os.kill(p, signal.SIGKILL)
        assert not left, f"Ray processes left behind: {left}"


def _ready(env: dict, address: str) -> bool:
    probe = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", "--address", address],
                           env=env, capture_output=True, text=True, timeout=120)
    return probe.returncode == 0


def run_cli(env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamabatch", "run", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def start_cli(env: dict, stderr_file: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llamabatch", "run", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(stderr_file, "w"), text=True)


def lines_file(path: Path, n: int, max_tokens: int) -> Path:
    """n lines of every JSON shape: plain prompts (with and without an id), chat messages,
    OpenAI Batch requests. (A bare text line in a .jsonl file is that line's invalid_json
    error since the hardening issue: text lines belong in .txt files.)"""
    rows = []
    for i in range(n):
        topic = ["the sea", "a city", "bread", "winter", "a clock"][i % 5]
        if i % 4 == 0:
            rows.append(json.dumps({"custom_id": f"o{i}", "method": "POST", "url": CHAT,
                                    "body": {"model": "x", "max_tokens": max_tokens,
                                             "messages": [{"role": "user", "content": f"Write about {topic} {i}"}]}}))
        elif i % 4 == 1:
            rows.append(json.dumps({"id": f"m{i}", "max_tokens": max_tokens,
                                    "messages": [{"role": "user", "content": f"Name a fact about {topic}"}]}))
        elif i % 4 == 2:
            rows.append(json.dumps({"prompt": f"Line {i}: a short story about {topic} begins",
                                    "max_tokens": max_tokens}))
        else:
            rows.append(json.dumps({"id": f"p{i}", "prompt": f"Item {i}. Here is a poem about {topic}:",
                                    "max_tokens": max_tokens}))
    path.write_text("\n".join(rows) + "\n")
    return path


def records(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def rid(record: dict):
    return record["custom_id"] if "custom_id" in record else record["id"]


def text_of(record: dict) -> str:
    if "response" in record:
        choice = record["response"]["body"]["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"]
    return record["text"]


def shape(record: dict):
    """Keys, nested, without values: the record's shape."""
    if isinstance(record, dict):
        return {k: shape(v) for k, v in record.items() if k not in ("id", "created", "system_fingerprint")}
    return type(record).__name__ if record is not None else None


def wait_records(path: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_bytes().count(b"\n") >= n):
        assert proc.poll() is None, "run ended early"
        assert time.monotonic() < deadline, f"fewer than {n} records after {timeout}s"
        time.sleep(0.05)


def test_two_workers_give_what_a_local_run_gives(cluster, ray_env, tmp_path):
    # Greedy text is bit-identical only for the same batch-mates (../shared/probes/README.md:
    # gemm vs gemv rows, cached vs fresh prefixes). One slot per engine and no prefix cache
    # make every line run alone on either side, so the texts must match exactly.
    env, _ = ray_env
    inp = lines_file(tmp_path / "in.jsonl", 16, 6)
    alone = ["--n-parallel", "1", "--n-ctx", "512", "--no-cache-prompt", "--temperature", "0", "--max-tokens", "6"]
    local = run_cli(env, str(inp), "-o", str(tmp_path / "local.jsonl"), *alone, "-t", "1")
    assert local.returncode == 0, local.stderr
    ray = run_cli(env, str(inp), "-o", str(tmp_path / "ray.jsonl"), "--ray", cluster, *TWO_WORKERS, *alone,
                  "--progress-every", "0")
    assert ray.returncode == 0, ray.stderr
    a, b = records(tmp_path / "local.jsonl"), records(tmp_path / "ray.jsonl")
    assert len(b) == 16
    assert [rid(r) for r in b] == [rid(r) for r in a]  # --order input, as locally
    assert [shape(r) for r in b] == [shape(r) for r in a]
    assert [text_of(r) for r in b] == [text_of(r) for r in a]
    assert all(r.get("error") is None and r.get("response", {}).get("status_code", 200) == 200 for r in b)
    # one summary line per worker, and per-worker rates in the progress lines
    workers = re.findall(r"^  (w\d) on 127\.0\.0\.1 .*: (\d+) line\(s\)", ray.stderr, re.M)
    assert [w for w, _ in workers] == ["w1", "w2"], ray.stderr
    assert sum(int(n) for _, n in workers) == 16
    assert re.search(r"w1 [\d.]+ lines/s \d+ tok/s, w2 ", ray.stderr), ray.stderr
    assert "0 worker restart(s), 0 line(s) retried" in ray.stderr


def test_the_default_auto_slots_are_chosen_by_each_worker(cluster, ray_env, tmp_path):
    # `run prompts.jsonl --ray` with no --n-parallel used to stop with "--n-parallel auto is
    # not supported with --ray yet" (exit 2). Each worker now resolves auto on its own node
    # (bounded here by the file's 6 lines), and the header names each worker's choice.
    env, _ = ray_env
    inp = lines_file(tmp_path / "in.jsonl", 6, 2)
    ray = run_cli(env, str(inp), "-o", str(tmp_path / "out.jsonl"), "--ray", cluster, *TWO_WORKERS,
                  "--n-ctx", "2048", "--temperature", "0", "--progress-every", "0")
    assert ray.returncode == 0, ray.stderr
    got = records(tmp_path / "out.jsonl")
    assert len(got) == 6 and all(r.get("error") is None for r in got)
    header = re.search(r"^llamabatch run: .*, 2 engine\(s\) \((w1: \d+ slots x \d+ tokens, auto: [^;]+); "
                       r"(w2: \d+ slots x \d+ tokens, auto: .+)\) on Ray cluster", ray.stderr, re.M)
    assert header, ray.stderr
    for name in ("w1", "w2"):
        n = int(re.search(rf"^llamabatch run: {name}: node .*, (\d+) slots \(auto: ", ray.stderr, re.M).group(1))
        assert 1 <= n <= 6  # never more slots than lines


def test_a_killed_worker_and_a_stopped_one_lose_no_line(cluster, ray_env, tmp_path):
    """w1 is killed (SIGKILL) and w2 hangs (SIGSTOP: it does not even answer) at the same moment,
    in one run: the dead one's lines are retried, and the stopped one is killed after the
    watchdog's bound and its lines are retried as for a dead one."""
    env, _ = ray_env
    inp = lines_file(tmp_path / "in.jsonl", 20, 8)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.txt"
    proc = start_cli(env, err, str(inp), "-o", str(out), "--ray", cluster, *TWO_WORKERS, *SLOTS,
                     "--max-tokens", "8", "--order", "completion", "--watchdog", "3")
    try:
        wait_records(out, 4, proc)
        header = err.read_text()
        killed, stopped = (int(re.search(rf"{w}: node \S+, pid (\d+)", header).group(1)) for w in ("w1", "w2"))
        os.kill(killed, signal.SIGKILL)
        os.kill(stopped, signal.SIGSTOP)
        assert proc.wait(timeout=900) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    got = records(out)
    ids = [rid(r) for r in got]
    assert len(got) == 20 and len(set(ids)) == 20
    assert all(r.get("error") is None and r.get("response", {}).get("status_code", 200) == 200 for r in got)
    stderr = err.read_text()
    assert re.search(r"w1 on .*died 1 time\(s\) with [1-9]\d* line\(s\) in flight", stderr), stderr
    assert re.search(r"w2 on .*died 1 time\(s\) with [1-9]\d* line\(s\) in flight.*killed by the watchdog",
                     stderr), stderr
    assert re.search(r"2 worker restart\(s\), [1-9]\d* line\(s\) retried", stderr), stderr
    assert not _alive(stopped), "the stopped worker process was left behind"


def test_a_model_missing_on_the_workers_stops_before_any_work_and_our_ray_instance_goes(ray_env, tmp_path):
    # Bare --ray: the run starts a Ray instance of its own (in its session), fails on the
    # workers' model check, and must take every Ray process it started with it.
    env, _ = ray_env
    inp = lines_file(tmp_path / "in.jsonl", 4, 2)
    missing = tmp_path / "nowhere" / "model.gguf"
    proc = subprocess.Popen([sys.executable, "-m", "llamabatch", "run", str(inp), "-o", str(tmp_path / "out.jsonl"),
                             "--ray", *TWO_WORKERS, *SLOTS, "--model", str(missing)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("llamabatch: error:")]
    assert len(errors) == 1 and "node 127.0.0.1" in errors[0] and str(missing) in errors[0], err
    assert out == "" and not (tmp_path / "out.jsonl").exists()
    deadline = time.monotonic() + 30
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _session(proc.pid) == []


def _session(sid: int) -> list[int]:
    """Processes still in the run's session: the Ray instance it started would be."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(entry))
    return found


def test_resume_after_kill_9_of_the_driver(cluster, ray_env, tmp_path):
    env, _ = ray_env
    inp = lines_file(tmp_path / "in.jsonl", 20, 6)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.txt"
    args = [str(inp), "-o", str(out), "--ray", cluster, *TWO_WORKERS, *SLOTS, "--max-tokens", "6"]
    proc = start_cli(env, err, *args)
    try:
        wait_records(out, 6, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    first = out.read_bytes().count(b"\n")
    assert first < 20
    resumed = run_cli(env, *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    got = records(out)
    ids = [rid(r) for r in got]
    assert len(got) == 20 and len(set(ids)) == 20, resumed.stderr
    assert re.search(rf"resuming: {first} record\(s\) already", resumed.stderr), resumed.stderr
