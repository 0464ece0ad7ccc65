"""The disk prefix store (llamabatch.prefix_store): no model, real files, real processes.

Payloads here are arbitrary bytes derived from the tokens (the store never looks inside them),
so a wrong or partial payload shows up as a mismatch with `payload_for(tokens)`.
"""
from __future__ import annotations

import ast
import ctypes
import errno
import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llamabatch.prefix_store import PrefixStore, StoreHit
from llamabatch.prefix_store import atomic_write
from llamabatch.prefix_store.file_format import tokens_to_le
from llamabatch.core.prefixes.common_prefix import common_prefix
from llamabatch.prefix_store.index import PrefixIndex, sort_key
from llamabatch.prefix_store.naming import entry_key, fingerprint_folder

FP = {"model_sha256": "aa" * 32, "llama_cpp": "b1234", "kv": "unified", "swa_full": "1", "type_k": "f16"}
OTHER_FP = {**FP, "model_sha256": "bb" * 32}
REPO = Path(__file__).resolve().parents[1]


def payload_for(tokens, size: int = 3000) -> bytes:
    seed = hashlib.sha256(struct.pack(f"<{len(tokens)}I", *tokens)).digest()
    return (seed * (size // len(seed) + 1))[:size]


def kv_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.kv"))


def tmp_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/.*.tmp"))


def saved(store: PrefixStore, tokens, payload=None) -> str:
    name = store.save(tokens, payload_for(tokens) if payload is None else payload)
    assert name is not None
    assert store.flush(5)
    return name


@pytest.fixture
def store(tmp_path):
    s = PrefixStore(tmp_path / "store", FP, 10**8)
    yield s
    s.close()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_the_package_imports_the_standard_library_only():
    # no llama_cpp, no engine: the store is usable (and testable) on its own
    import llamabatch.prefix_store as package

    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names | {"__future__"}, (path.name, name)


# -- round trip and lookups ---------------------------------------------------------------------

def test_round_trip_across_store_instances(store, tmp_path):
    tokens = [random.Random(1).randrange(262_144) for _ in range(3000)]
    name = saved(store, tokens)
    assert name.startswith(fingerprint_folder(FP) + "/") and name.endswith(".kv")
    assert (tmp_path / "store" / name).is_file()

    fresh = PrefixStore(tmp_path / "store", FP, 10**8)  # as another process would open it
    hit = fresh.lookup(tokens)
    assert hit == StoreHit(name, 3000, 3000)
    got_tokens, payload = fresh.load(hit)
    assert got_tokens == tokens and bytes(payload) == payload_for(tokens)
    # writable, so the engine can pass it to llama.cpp through ctypes without another copy
    assert bytes((ctypes.c_uint8 * len(payload)).from_buffer(payload)) == payload_for(tokens)
    assert fresh.stats["loaded"] == 1 and fresh.stats["entries"] == 1
    assert store.stats["saved"] == 1
    # another fingerprint sees nothing of it
    assert PrefixStore(tmp_path / "store", OTHER_FP, 10**8).lookup(tokens) is None


def test_lookup_picks_the_longest_common_prefix_and_honours_min_common(store):
    shared = list(range(1, 101))
    a = shared + [500 + i for i in range(60)]
    b = shared[:50] + [900 + i for i in range(200)]
    c = [7, 7, 7]
    names = {key: saved(store, t) for key, t in (("a", a), ("b", b), ("c", c))}

    query = shared + [500 + i for i in range(30)] + [1, 2, 3]  # 130 tokens with a, 50 with b
    assert store.lookup(query) == StoreHit(names["a"], 130, 160)
    assert store.lookup(query, min_common=130) == StoreHit(names["a"], 130, 160)
    assert store.lookup(query, min_common=131) is None
    assert store.lookup(shared[:50] + [900, 5]) == StoreHit(names["b"], 51, 250)
    assert store.lookup([7, 7, 8]) == StoreHit(names["c"], 2, 3)
    assert store.lookup([8, 1, 2]) is None  # no entry starts with 8
    assert store.lookup([]) is None


def test_lookup_prefers_the_entry_that_is_exactly_the_shared_prefix(store):
    prompt = list(range(10, 90))
    longer = prompt[:40] + [1] * 30  # sorts between prompt[:40] and prompt
    exact = saved(store, prompt[:40])
    saved(store, longer)
    saved(store, prompt[:40] + [5000])  # sorts after the prompt
    assert store.lookup(prompt) == StoreHit(exact, 40, 40)


def test_covered_is_the_longest_prefix_already_held(store):
    tokens = list(range(300))
    assert store.covered(tokens) == 0
    saved(store, tokens[:200])
    assert store.covered(tokens) == 200
    assert store.covered(tokens[:150]) == 150
    assert store.covered([1] + tokens) == 0
    assert store.save(tokens[:200], b"again") is None  # exactly these tokens exist already


def test_the_index_follows_what_other_stores_save_and_remove(tmp_path):
    root = tmp_path / "store"
    writer, reader = PrefixStore(root, FP, 10**8), PrefixStore(root, FP, 10**8)
    first = saved(writer, [1, 2, 3])
    assert reader.lookup([1, 2, 3]).name == first
    folder = root / fingerprint_folder(FP)
    seen = folder.stat().st_mtime_ns
    # A second save inside the same timestamp tick leaves the folder's mtime unchanged; the
    # reader must still find it (the mtime was recent, so it did not trust it).
    second = saved(writer, [4, 5, 6])
    os.utime(folder, ns=(seen, seen))
    assert reader.lookup([4, 5, 6]).name == second
    (root / first).unlink()
    assert reader.lookup([1, 2, 3]) is None
    assert reader.stats["entries"] == 1 and reader.stats["refused"] == 0


def test_index_lookup_matches_a_brute_force_search():
    rng = random.Random(7)
    index, entries = PrefixIndex(), []
    base = [rng.randrange(300) for _ in range(600)]
    for i in range(150):
        tokens = base[: rng.randrange(600)] + [rng.randrange(300) for _ in range(rng.randrange(1, 300))]
        entries.append(tokens)
        index.add(str(i), sort_key(tokens), 1)

    def brute(q):
        return max(next((k for k, (x, y) in enumerate(zip(q, e)) if x != y), min(len(q), len(e))) for e in entries)

    for _ in range(100):
        source = entries[rng.randrange(len(entries))]
        query = source[: rng.randrange(len(source) + 1)] + [rng.randrange(300) for _ in range(rng.randrange(3))]
        if query:
            match = index.longest(sort_key(query))
            assert (match.common if match else 0) == brute(query)
    # chunk edges of the byte comparison
    for split in (0, 1, 4095, 4096, 4097, 10_000):
        a = bytes(12_000)
        b = a[:split] + b"\x01" + a[split + 1:]
        assert common_prefix(a, b) == split


def test_lookup_is_fast_with_long_prompts_and_hundreds_of_entries(store):
    rng = random.Random(3)
    instruction = [rng.randrange(262_144) for _ in range(2000)]
    index = PrefixIndex()
    for i in range(400):
        tokens = instruction[: rng.randrange(2000)] + [rng.randrange(262_144) for _ in range(2000)]
        index.add(str(i), sort_key(tokens), 1)
    query = sort_key(instruction + [1] * 2000)
    start = time.perf_counter()
    for _ in range(200):
        index.longest(query)
    assert (time.perf_counter() - start) / 200 < 0.005  # measured ~0.1 ms


# -- bad files: refused, deleted, never raised ----------------------------------------------------

def _flip(path: Path, offset_from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _old_version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<I", 0)
    path.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(5000))


def _deep_json(path: Path) -> None:
    header = b"[" * 100_000
    path.write_bytes(b"LBPREFIX" + struct.pack("<II", 1, len(header)) + header)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


# Every damage but a changed payload byte shows in the header, size or tokens, which the index
# reads: refused at lookup. A payload byte only the checksum catches, at load.
@pytest.mark.parametrize("damage, seen_at_lookup", [
    (_truncate, True), (lambda p: _flip(p, 10), False), (lambda p: _flip(p, 4000), True), (_old_version, True),
    (_garbage, True), (_deep_json, True), (_empty, True),
], ids=["torn", "payload-byte-flipped", "token-byte-flipped", "old-version", "garbage", "deep-json", "empty"])
def test_a_damaged_file_is_refused_and_deleted(store, tmp_path, damage, seen_at_lookup):
    tokens = list(range(1000, 1500))
    name = saved(store, tokens)
    path = tmp_path / "store" / name
    damage(path)

    fresh = PrefixStore(tmp_path / "store", FP, 10**8)
    hit = fresh.lookup(tokens)
    assert (hit is None) == seen_at_lookup
    if hit is not None:
        assert fresh.load(hit) is None
    assert not path.exists()
    assert fresh.stats["refused"] == 1
    assert fresh.lookup(tokens) is None and fresh.covered(tokens) == 0


def test_a_file_of_another_fingerprint_in_this_folder_is_refused(tmp_path):
    root = tmp_path / "store"
    tokens = list(range(64))
    other = PrefixStore(root, OTHER_FP, 10**8)
    foreign = root / saved(other, tokens)
    other.close()
    # placed under the very name this fingerprint's entry would have: only the header tells
    folder = fingerprint_folder(FP)
    (root / folder).mkdir()
    target = root / folder / (entry_key(folder, tokens_to_le(tokens)) + ".kv")
    target.write_bytes(foreign.read_bytes())

    store = PrefixStore(root, FP, 10**8)
    assert store.lookup(tokens) is None
    assert not target.exists() and foreign.exists()
    assert store.stats["refused"] == 1


def test_load_after_the_file_vanished_or_with_a_foreign_hit_returns_none(store, tmp_path):
    tokens = list(range(50))
    hit = store.lookup(tokens) or StoreHit(saved(store, tokens), 50, 50)
    (tmp_path / "store" / hit.name).unlink()
    assert store.load(hit) is None
    assert store.load(StoreHit("0123456789abcdef/x.kv", 5, 5)) is None
    assert store.load(StoreHit("../../etc/passwd", 5, 5)) is None
    assert store.stats["refused"] == 0


def test_a_payload_buffer_is_copied_so_the_caller_may_reuse_it(store):
    tokens = list(range(20))
    buffer = bytearray(payload_for(tokens))
    assert store.save(tokens, buffer) is not None
    buffer[:] = bytes(len(buffer))
    assert store.flush(5)
    assert bytes(store.load(store.lookup(tokens))[1]) == payload_for(tokens)

    handed_over = bytearray(payload_for([5, 6]))
    assert store.save([5, 6], handed_over, owned=True) is not None  # no copy: the store keeps it
    assert store.flush(5)
    assert bytes(store.load(store.lookup([5, 6]))[1]) == bytes(handed_over)


# -- size cap ------------------------------------------------------------------------------------

def test_the_lru_cap_holds_and_a_load_keeps_an_entry(tmp_path):
    entry_bytes = 4000 + 100 * 4 + 200  # payload, tokens, header (about)
    store = PrefixStore(tmp_path / "store", FP, 5 * entry_bytes)
    series = [[i] + list(range(100, 199)) for i in range(20)]
    names = []
    for i, tokens in enumerate(series):
        names.append(saved(store, tokens, payload_for(tokens, 4000)))
        if i >= 1:
            assert store.load(store.lookup(series[0])) is not None  # entry 0 stays recently used
        assert sum(p.stat().st_size for p in kv_files(tmp_path / "store")) <= 5 * entry_bytes
        time.sleep(0.02)  # past the file system's timestamp tick, so mtimes order the uses
    on_disk = {f"{p.parent.name}/{p.name}" for p in kv_files(tmp_path / "store")}
    assert names[0] in on_disk  # loaded every time: never the least recently used
    assert set(names[-3:]) <= on_disk  # the newest saves
    assert not on_disk & set(names[1:15])  # the oldest unused ones went first
    assert store.stats["entries"] == len(on_disk)
    store.close()


def test_the_cap_counts_every_fingerprint(tmp_path):
    root = tmp_path / "store"
    first = PrefixStore(root, OTHER_FP, 20_000)
    saved(first, [1, 2, 3], bytes(15_000))
    time.sleep(0.02)
    second = PrefixStore(root, FP, 20_000)
    saved(second, [1, 2, 3], bytes(15_000))  # both do not fit: the older one goes
    assert [p.parent.name for p in kv_files(root)] == [fingerprint_folder(FP)]
    assert first.lookup([1, 2, 3]) is None


def test_files_that_are_not_the_stores_are_never_evicted_or_deleted(tmp_path):
    root = tmp_path / "store"
    (root / "notes").mkdir(parents=True)
    folder = root / fingerprint_folder(FP)
    folder.mkdir()
    theirs = [root / "notes" / "big.kv", folder / "foo.kv", root / "top.kv"]
    for path in theirs:
        path.write_bytes(bytes(50_000))
    store = PrefixStore(root, FP, 10_000)
    first = saved(store, [1, 2], bytes(5000))
    time.sleep(0.02)
    second = saved(store, [3, 4], bytes(5000))  # the two entries exceed 10,000 bytes
    assert [f"{p.parent.name}/{p.name}" for p in kv_files(root) if p not in theirs] == [second]
    assert all(path.exists() for path in theirs) and first != second
    assert store.stats["refused"] == 0


def test_an_entry_larger_than_max_bytes_is_not_saved(tmp_path):
    store = PrefixStore(tmp_path / "store", FP, 5000)
    assert store.save([1, 2, 3], bytes(6000)) is None
    assert store.save([1, 2, 3], bytes(4000)) is not None
    assert store.flush(5)
    assert len(kv_files(tmp_path / "store")) == 1
    assert store.stats["dropped"] == 1


def test_max_bytes_zero_is_off_and_touches_nothing(tmp_path):
    store = PrefixStore(tmp_path / "store", FP, 0)
    assert not store.enabled
    assert store.save([1, 2, 3], b"x") is None
    assert store.lookup([1, 2, 3]) is None and store.covered([1, 2, 3]) == 0
    assert store.load(StoreHit(f"{fingerprint_folder(FP)}/{'0' * 64}.kv", 3, 3)) is None
    assert store.flush(0.1)
    store.close()
    assert not (tmp_path / "store").exists()
    with pytest.raises(ValueError):
        PrefixStore(tmp_path / "store", FP, -1)


# -- writes that fail, hang or die -------------------------------------------------------------

def test_disk_full_drops_the_save_leaves_no_tmp_and_the_store_goes_on(store, tmp_path, monkeypatch):
    real_write = atomic_write.write_chunks

    def half_then_full(fd, chunks):
        chunks = list(chunks)
        os.write(fd, bytes(chunks[0])[: len(chunks[0]) // 2])  # a partial tmp file exists
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_write, "write_chunks", half_then_full)
    assert store.save([1, 2, 3], payload_for([1, 2, 3])) is not None  # queued
    assert store.flush(5)
    assert store.stats["dropped"] == 1 and store.stats["saved"] == 0
    assert kv_files(tmp_path / "store") == [] and tmp_files(tmp_path / "store") == []
    assert store.lookup([1, 2, 3]) is None

    monkeypatch.setattr(atomic_write, "write_chunks", real_write)
    saved(store, [1, 2, 3])
    assert store.load(store.lookup([1, 2, 3]))[0] == [1, 2, 3]


def test_a_root_that_is_a_file_drops_saves_and_never_raises(tmp_path):
    root = tmp_path / "not-a-folder"
    root.write_text("someone's file")
    store = PrefixStore(root, FP, 10**8)
    assert store.save([1, 2], b"kv") is not None  # queued; the write then fails
    assert store.flush(5)
    assert store.lookup([1, 2]) is None and store.covered([1, 2]) == 0
    assert store.stats["dropped"] == 1 and store.stats["entries"] == 0
    assert root.read_text() == "someone's file"
    store.close()


def _hanging_write(release: threading.Event):
    def write(fd, chunks):
        release.wait(30)
        atomic_write.os.write(fd, b"".join(bytes(c) for c in chunks))
    return write


def test_save_never_blocks_when_the_writer_is_busy(tmp_path, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(atomic_write, "write_chunks", _hanging_write(release))
    store = PrefixStore(tmp_path / "store", FP, 10**8, max_pending_bytes=200)
    try:
        start = time.monotonic()
        assert store.save([1], b"a" * 150) is not None
        assert store.save([2], b"b" * 50) is not None
        assert store.save([3], b"c") is None  # the pending writes hold 200 bytes already: dropped, not waited for
        assert store.save([1], b"a" * 150) is None  # the same entry is already queued
        assert time.monotonic() - start < 1.0
        assert store.stats["pending"] == 2 and store.stats["dropped"] == 1
        assert not store.flush(timeout=0.1)
    finally:
        release.set()
    assert store.flush(5)
    assert store.stats["saved"] == 2
    assert store.save([4], b"d" * 500) is not None  # nothing pending: one entry always fits, whatever its size
    assert store.flush(5) and store.stats["saved"] == 3
    store.close()


def test_close_is_bounded_when_a_write_hangs(tmp_path, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(atomic_write, "write_chunks", _hanging_write(release))
    store = PrefixStore(tmp_path / "store", FP, 10**8, max_pending_bytes=4)
    try:
        assert store.save([1], b"a") is not None
        assert store.save([2], b"b") is not None
        start = time.monotonic()
        store.close(timeout=0.3)
        assert time.monotonic() - start < 1.5
        assert store.save([3], b"c") is None  # closed
        assert store.stats["dropped"] == 1  # [2] was still queued
    finally:
        release.set()


KILLED_WRITER = """
import os, sys, time
from llamabatch.prefix_store import PrefixStore, atomic_write

def slow(fd, chunks):
    chunks = list(chunks)
    os.write(fd, bytes(chunks[0]))  # the header is on disk, the rest never will be
    os.fsync(fd)
    print("writing", flush=True)
    time.sleep(60)

atomic_write.write_chunks = slow
store = PrefixStore(sys.argv[1], %r, 10**8)
store.save(list(range(100)), b"x" * 100_000)
time.sleep(60)
"""


def test_kill_9_in_the_middle_of_a_save_leaves_nothing_loadable(tmp_path):
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER % (FP,), str(root)], env=child_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(10)
        child.stdout.close()
    leftovers = tmp_files(root)
    assert [p.name.split(".")[2] for p in leftovers] == [str(child.pid)]
    assert kv_files(root) == []

    store = PrefixStore(root, FP, 10**8)  # opening removes the dead writer's tmp file
    assert tmp_files(root) == []
    assert store.lookup(list(range(100))) is None
    saved(store, list(range(100)))  # and the same entry can be written again
    assert store.load(store.lookup(list(range(100))))[0] == list(range(100))


def test_a_live_writers_tmp_file_is_kept_at_open(tmp_path):
    folder = tmp_path / "store" / fingerprint_folder(FP)
    folder.mkdir(parents=True)
    live = folder / f".{'a' * 64}.{os.getppid()}.tmp"
    mine = folder / f".{'b' * 64}.{os.getpid()}.tmp"
    other = folder / "notes.txt"
    for path in (live, mine, other):
        path.write_bytes(b"partial")
    PrefixStore(tmp_path / "store", FP, 10**8)
    assert live.exists() and mine.exists() and other.exists()


# -- two processes on one store -----------------------------------------------------------------

WRITER_PROCESS = """
import hashlib, json, struct, sys
from llamabatch.prefix_store import PrefixStore

def payload_for(tokens, size):
    seed = hashlib.sha256(struct.pack(f"<{len(tokens)}I", *tokens)).digest()
    return (seed * (size // len(seed) + 1))[:size]

store = PrefixStore(sys.argv[1], %r, 600_000)
for i in range(60):
    tokens = [i %% 5] + list(range(1000 + i, 1100 + 3 * i))
    while store.save(tokens, payload_for(tokens, 20_000 + 997 * i)) is None:
        store.flush(1)
    store.flush(5)
store.close()
print(json.dumps(store.stats), flush=True)
"""


def test_two_processes_share_one_store_and_a_reader_never_sees_a_partial_entry(tmp_path):
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", WRITER_PROCESS % (FP,), str(root)], env=child_env(),
                             stdout=subprocess.PIPE, text=True)
    reader = PrefixStore(root, FP, 600_000)
    loads = misses = 0
    try:
        deadline = time.monotonic() + 30
        while child.poll() is None and time.monotonic() < deadline:
            i = random.randrange(60)
            hit = reader.lookup([i % 5] + list(range(1000 + i, 1100 + 3 * i)) + [5])
            if hit is None:
                misses += 1
                continue
            got = reader.load(hit)  # None only when evicted meanwhile
            if got is not None:
                tokens, payload = got
                i = (len(tokens) - 101) // 2  # which entry, from its shape
                assert tokens == [i % 5] + list(range(1000 + i, 1100 + 3 * i))
                assert bytes(payload) == payload_for(tokens, 20_000 + 997 * i)
                loads += 1
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait(10)
    writer_stats = json.loads(out)
    assert writer_stats["saved"] == 60 and writer_stats["refused"] == 0
    assert loads > 0
    assert reader.stats["refused"] == 0  # never a torn or partial file
    assert sum(p.stat().st_size for p in kv_files(root)) <= 600_000
    assert tmp_files(root) == []


# -- the whole-entry lookup the engine restores with ------------------------------------------

def _brute_longest_starting(entries: dict[str, list[int]], query: list[int], min_tokens: int):
    fits = [(len(t), n) for n, t in entries.items() if len(t) >= max(min_tokens, 1) and query[:len(t)] == t]
    return max(fits)[1] if fits else None


def test_longest_starting_finds_the_longest_entry_that_starts_the_query_as_brute_force_does():
    rng = random.Random(7)
    for _ in range(200):
        index, entries = PrefixIndex(), {}
        base = [rng.randrange(4) for _ in range(12)]
        for i in range(rng.randrange(1, 12)):
            cut = rng.randrange(1, len(base) + 1)
            tokens = base[:cut] + [rng.randrange(4) for _ in range(rng.randrange(3))]
            entries[f"e{i}"] = tokens
            index.add(f"e{i}", sort_key(tokens), 1)
        query = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(3))]
        min_tokens = rng.randrange(0, 6)
        match = index.longest_starting(sort_key(query), min_tokens)
        want = _brute_longest_starting(entries, query, min_tokens)
        if want is None:
            assert match is None, (entries, query, min_tokens)
        else:
            assert match is not None and len(entries[match.name]) == len(entries[want]), (entries, query)
            assert match.common == match.n_tokens == len(entries[match.name])


def test_store_longest_starting_and_holds(tmp_path):
    store = PrefixStore(tmp_path, {"model": "m"}, 1 << 20)
    for tokens in ([1, 2, 3], [1, 2, 3, 4, 5], [1, 9]):  # one at a time: at most two writes wait
        assert store.save(tokens, bytes(len(tokens))) and store.flush(5)
    hit = store.longest_starting([1, 2, 3, 4, 7, 8])
    assert hit is not None and hit.n_tokens == hit.common == 3  # [1,2,3,4,5] shares more, but does not start it
    assert store.longest_starting([1, 2, 3, 4, 5, 6]).n_tokens == 5
    assert store.longest_starting([1, 2, 3, 4, 7], min_tokens=4) is None
    assert store.holds([1, 2, 3]) and not store.holds([1, 2]) and not store.holds([1, 2, 3, 4])
    store.close()
