"""Chat turns in the disk prefix store, on the scripted fake runner (its KV bytes are its
tokens): each reply's prompt is saved and its row names the entry; -c / --resume restores it
and says so; only the newest turns keep an entry; /undo and /retry keep the bookkeeping right;
a database of schema 1 is migrated; a missing entry or another rendering just evaluates."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from llamabatch.chat.ollama_stats import parse_stats
from llamabatch.chat.store import MIGRATIONS, SCHEMA_VERSION, Store
from llamabatch.chat.turn_kv import KEEP, text_digest
from llamabatch.prefix_store import atomic_write
from cli_harness import invoke, runner_for

# the fake tokenizer gives about a token a character: turns this long are worth a file (> 128 tokens)
LONG = "Tell me about the weather in a long sentence that goes on and on. " * 3


def chat(tmp_path, args: list[str], stdin: str = ""):
    """`llamabatch chat --verbose ARGS` on the fake runner, state under tmp_path."""
    return invoke(["chat", "--temperature", "0", "--max-tokens", "16", "--verbose", *args], input=stdin,
                  runner=runner_for(reply=lambda prompt: f" Reply to {len(prompt)}."),
                  env={"XDG_STATE_HOME": str(tmp_path / "state")})


def rows(tmp_path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "state" / "llamabatch" / "conversations.db") as db:
        return db.execute("SELECT id, conversation_id, role, content, kv_entry, kv_resume FROM messages "
                          "ORDER BY id").fetchall()


def store_root() -> Path:
    return Path(os.environ["LLAMABATCH_PREFIX_STORE"])  # each test's own (conftest)


def entry_files() -> set[str]:
    return {f"{p.parent.name}/{p.name}" for p in store_root().rglob("*.kv")}


def restored(block: dict) -> int:
    return int(block.get("restored tokens", "0").split()[0])


def test_each_turn_names_its_entry_only_the_newest_keep_one_and_continue_restores_the_last(tmp_path):
    first = chat(tmp_path, [], f"{LONG}\n{LONG}x\n{LONG}y\n")
    assert first.exit_code == 0, first.stderr
    assert all(restored(b) == 0 for b in parse_stats(first.stderr))  # the slot served them: nothing from disk
    asked = [c.sampler.params.store_prefix for p in first.engines[0].runner.plans for c in p.plan.chunks
             if c.sampler is not None and c.wants_logits]
    assert asked and all(asked)  # every turn's request asked for its prompt to be kept
    replies = [r for r in rows(tmp_path) if r[2] == "assistant"]
    assert [r[4] is not None for r in replies] == [False, True, True]  # KEEP = 2 newest
    assert entry_files() == {r[4] for r in replies[1:]}  # the first turn's file went with its row's name
    resume = json.loads(replies[-1][5])
    assert resume["reply_tokens"] and len(resume["prompt_sha256"]) == 64

    again = chat(tmp_path, ["-c"], "and one more\n")
    assert again.exit_code == 0, again.stderr
    (block,) = parse_stats(again.stderr)
    # the last turn's prompt came from disk (by the resume's warm-up), and only the new part was evaluated
    engine = again.engines[0]
    entry_tokens = engine.disk.store.tokens_of(replies[-1][4])
    assert restored(block) == len(entry_tokens)
    assert int(block["prompt eval count"].split()[0]) < 40
    assert engine.runner.restores[0][1:] == (len(entry_tokens), True)
    # the new reply's entry replaced the oldest: still two per conversation
    assert len(entry_files()) == KEEP
    assert [r[4] is not None for r in rows(tmp_path) if r[2] == "assistant"] == [False, False, True, True]


def test_resume_by_id_and_stats_count_the_restored_tokens(tmp_path):
    assert chat(tmp_path, [], f"{LONG}\n{LONG}x\n").exit_code == 0
    again = chat(tmp_path, ["--resume", "1"], "/stats\nnext\n/stats\n")
    assert again.exit_code == 0, again.stderr
    lines = [line for line in again.stderr.splitlines() if line.startswith("prompt tokens:")]
    assert "of the cached from the disk prefix store" not in lines[0]  # no reply yet
    assert "of the cached from the disk prefix store)" in lines[1]


def test_undo_drops_the_undone_turns_entry_and_continue_restores_the_one_before(tmp_path):
    first = chat(tmp_path, [], f"{LONG}\n{LONG}x\n{LONG}y\n/undo\n")
    assert first.exit_code == 0, first.stderr
    replies = [r for r in rows(tmp_path) if r[2] == "assistant"]
    assert len(replies) == 2 and replies[-1][4] is not None
    assert entry_files() == {replies[-1][4]}  # the undone turn's entry is gone; the one before it stays
    again = chat(tmp_path, ["-c"], "instead\n")
    (block,) = parse_stats(again.stderr)
    assert restored(block) == len(again.engines[0].disk.store.tokens_of(replies[-1][4]))


def test_a_disk_slower_than_the_turns_keeps_every_turns_entry_and_writes_no_dropped_one(tmp_path, monkeypatch):
    """Turns typed faster than the store writes them (a script, a slow disk): each turn's entry is
    still queued and named, and the one dropped by KEEP while still queued never lands on disk."""
    slow = atomic_write.write_chunks

    def write_slowly(fd, chunks):
        time.sleep(0.3)
        slow(fd, chunks)
    monkeypatch.setattr(atomic_write, "write_chunks", write_slowly)
    first = chat(tmp_path, [], f"{LONG}\n{LONG}x\n{LONG}y\n{LONG}z\n")
    assert first.exit_code == 0, first.stderr
    replies = [r for r in rows(tmp_path) if r[2] == "assistant"]
    assert [r[4] is not None for r in replies] == [False, False, True, True]
    assert entry_files() == {r[4] for r in replies[2:]}


def test_retry_keeps_the_same_entry_for_the_same_prompt(tmp_path):
    result = chat(tmp_path, [], f"{LONG}\n{LONG}x\n/retry\n")
    assert result.exit_code == 0, result.stderr
    replies = [r for r in rows(tmp_path) if r[2] == "assistant"]
    assert len(replies) == 2 and replies[0][4] is not None and replies[1][4] is not None
    assert entry_files() == {replies[0][4], replies[1][4]}


def test_a_conversation_rendered_otherwise_or_a_missing_entry_is_evaluated_as_before(tmp_path):
    assert chat(tmp_path, [], f"{LONG}\n{LONG}x\n").exit_code == 0
    other = chat(tmp_path, ["-c", "--system", "Answer in French."], "next\n")
    assert other.exit_code == 0, other.stderr
    (block,) = parse_stats(other.stderr)
    # the warm-up restored the saved turn, but the prompt now starts with another system prompt
    assert int(block["prompt eval count"].split()[0]) > len(LONG)
    for path in store_root().rglob("*.kv"):
        path.unlink()  # evicted meanwhile, say
    gone = chat(tmp_path, ["-c"], "again\n")
    assert gone.exit_code == 0, gone.stderr
    (block,) = parse_stats(gone.stderr)
    assert restored(block) == 0 and gone.engines[0].runner.restores == []


def test_store_off_or_no_save_saves_no_turns(tmp_path):
    off = chat(tmp_path, ["--prefix-store", "off"], f"{LONG}\n{LONG}x\n")
    assert off.exit_code == 0, off.stderr
    assert all(r[4] is None for r in rows(tmp_path)) and entry_files() == set()
    nosave = chat(tmp_path, ["--no-save"], f"{LONG}\n{LONG}x\n")
    assert nosave.exit_code == 0, nosave.stderr
    # "record nothing": no turn asks for an entry, and the engine keeps no shared prefix on disk either
    runner = nosave.engines[0].runner
    assert nosave.engines[0].disk is None and off.engines[0].disk is None and entry_files() == set()
    assert runner.plans and not any(c.sampler.params.store_prefix for p in runner.plans for c in p.plan.chunks
                                    if c.sampler is not None)
    # unless the store is asked for by name: then the engine's own saves happen, turns still ask for none
    named = chat(tmp_path, ["--no-save", "--prefix-store", str(store_root())], f"{LONG}\n{LONG}x\n")
    assert named.exit_code == 0, named.stderr
    assert named.engines[0].disk is not None


def test_a_schema_1_database_is_migrated_and_its_conversations_continue(tmp_path):
    path = tmp_path / "state" / "llamabatch" / "conversations.db"
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        db.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
        db.execute("INSERT INTO conversations (started, updated, model, template, settings, system) "
                   "VALUES (1, 1, 'm', 't', '{}', NULL)")
        db.execute("INSERT INTO messages (conversation_id, role, content, time) VALUES (1, 'user', ?, 1)", (LONG,))
        db.execute("INSERT INTO messages (conversation_id, role, content, time) VALUES (1, 'assistant', 'Sunny.', 1)")
    again = chat(tmp_path, ["-c"], f"{LONG}x\n")
    assert again.exit_code == 0, again.stderr
    assert "continuing conversation 1: 2 messages" in again.stderr
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    listed = rows(tmp_path)
    assert [r[4] is not None for r in listed] == [False, False, False, True]


def test_release_keeps_an_entry_another_conversation_names(tmp_path):
    store = Store(tmp_path / "c.db")
    a = store.new_conversation(model="m", template="t", settings={}, system=None)
    b = store.new_conversation(model="m", template="t", settings={}, system=None)
    turn = lambda entry: [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "r", "kv_entry": entry, "kv_resume": {"prompt_sha256": "x"}}]
    store.change(b, add=turn("shared"))
    for entry in ("shared", "a2", "a3"):
        store.change(a, add=turn(entry))
    # a's oldest turn forgets "shared", but b still names it: not for deleting
    assert store.release_kv(a, keep=2) == []
    assert store.release_kv(a, keep=1) == ["a2"]
    assert store.release_kv(a, keep=1, gone=["a3", "nobody"]) == ["nobody"]  # a3 is still named
    stored = store.read(a)
    assert stored.kv_entries == [None, None, None, None, None, "a3"]
    assert stored.kv_resume[-1] == {"prompt_sha256": "x"}
    store.close()


def test_text_digest_is_the_prompt_texts_sha256():
    assert text_digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_the_store_reads_an_entrys_tokens_and_removes_only_its_own_entries(tmp_path):
    from llamabatch.prefix_store import PrefixStore

    outside = tmp_path / "keep.kv"
    outside.write_bytes(b"not ours")
    with PrefixStore(tmp_path / "store", {"model": "m"}, 1 << 20) as store:
        name = store.save([5, 6, 7], b"payload")
        assert store.flush(5)
        assert store.tokens_of(name) == [5, 6, 7] and store.holds([5, 6, 7])
        for other in ("../keep.kv", "0123456789abcdef/x.kv", name.split("/")[1], ""):
            assert store.remove(other) is False and store.tokens_of(other) is None
        assert store.remove(name) is True
        assert store.tokens_of(name) is None and not store.holds([5, 6, 7])
        assert store.remove(name) is False
    assert outside.read_bytes() == b"not ours"
