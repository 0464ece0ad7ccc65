"""Saved chats on chat's default model (SmolLM2-135M-Instruct, from the instruct extra the test
command installs), in real processes: continue with the cache, a one-shot in a pipeline, --list,
Ollama's /set parameter and /show info, /undo, two chats writing at once, and a damaged database."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from llamabatch.chat.ollama_stats import parse_stats

pytestmark = pytest.mark.model

CHAT = [sys.executable, "-m", "llamabatch", "chat", "--temperature", "0"]


def tokens(value: str) -> int:
    return int(value.split()[0])


def whole(block: dict[str, str]) -> int:
    """A reply's whole conversation: its prompt (evaluated + cached) and the reply."""
    return tokens(block["prompt eval count"]) + tokens(block["cached tokens"]) + tokens(block["eval count"])


def env_for(tmp_path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}


def chat(tmp_path, args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    proc = subprocess.run(CHAT + args, input=stdin, capture_output=True, text=True, timeout=300, env=env_for(tmp_path))
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_continue_reuses_the_cache_one_shot_reads_the_pipe_and_list_shows_both(tmp_path):
    first = chat(tmp_path, ["--max-tokens", "8", "--verbose"], "Hi, who are you?\nWhat is the capital of France?\n")
    assert first.returncode == 0, first.stderr
    earlier = parse_stats(first.stderr)[-1]
    again = chat(tmp_path, ["-c", "--max-tokens", "8", "--verbose"], "And of Germany?\n")
    assert again.returncode == 0, again.stderr
    assert "continuing conversation 1: 4 messages" in again.stderr
    (block,) = parse_stats(again.stderr)
    # the earlier turns were evaluated once on resume; this turn found them in the cache
    assert tokens(block["cached tokens"]) >= 0.9 * whole(earlier), (earlier, block)
    assert tokens(block["prompt eval count"]) < 20
    one_shot = chat(tmp_path, ["summarise this", "--max-tokens", "6"], "The meeting moved to Tuesday.\nBring the reports.\n")
    assert one_shot.returncode == 0 and one_shot.stdout.strip() and one_shot.stdout.count("\n") >= 1
    listing = chat(tmp_path, ["--list"])
    rows = listing.stdout.splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["2", "1"]
    assert rows[0].endswith("The meeting moved to Tuesday.") and rows[1].endswith("Hi, who are you?")
    assert all(" smollm2 " in r for r in rows)  # chat's default with the instruct extra installed


def test_set_parameter_show_info_and_undo(tmp_path):
    proc = chat(tmp_path, ["--max-tokens", "8", "--verbose"],
                "Hi there.\n/set parameter num_predict 5\nTell me a long story about a dragon.\n/show info\n"
                "/undo\nName three colours.\n")
    assert proc.returncode == 0, proc.stderr
    hello, story, after = parse_stats(proc.stderr)
    assert tokens(story["eval count"]) == 5
    info = proc.stderr.splitlines()
    assert "  model           smollm2" in info and "  architecture    llama" in info
    assert "  quantization    Q4_1" in info
    # after /undo the first exchange is still in the slot: only the new message is evaluated
    assert tokens(after["cached tokens"]) >= whole(hello), (hello, after)
    with sqlite3.connect(tmp_path / "state" / "llamabatch" / "conversations.db") as db:
        users = [c for (c,) in db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id")]
    assert users == ["Hi there.", "Name three colours."]


def test_two_chats_writing_at_once_keep_all_their_turns_and_a_damaged_database_is_one_line(tmp_path):
    env = env_for(tmp_path)
    procs = [subprocess.Popen(CHAT + ["--max-tokens", "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for name, proc in zip(("alpha", "beta"), procs):
        proc.stdin.write("".join(f"{name} turn {i}\n" for i in range(4)))
        proc.stdin.close()
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    path = tmp_path / "state" / "llamabatch" / "conversations.db"
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT conversation_id, content FROM messages WHERE role = 'user' ORDER BY id").fetchall()
    by_conversation: dict[int, list[str]] = {}
    for cid, content in rows:
        by_conversation.setdefault(cid, []).append(content)
    assert sorted(by_conversation.values()) == [[f"alpha turn {i}" for i in range(4)], [f"beta turn {i}" for i in range(4)]]
    # now damage it: --list is one line (exit 1); a chat goes on and keeps its turns in a JSON file
    for name in os.listdir(path.parent):
        if name.startswith("conversations.db-"):
            os.remove(path.parent / name)  # the WAL would otherwise be checkpointed over the garbage
    path.write_bytes(b"\x00garbage\x00" * 512)
    before = path.read_bytes()
    listing = chat(tmp_path, ["--list"])
    assert listing.returncode == 1 and listing.stderr.count("\n") == 1 and "is not a SQLite database" in listing.stderr
    one_shot = chat(tmp_path, ["Hello?", "--max-tokens", "3"])
    assert one_shot.returncode == 0 and one_shot.stdout.strip()
    assert [line for line in one_shot.stderr.splitlines() if line.startswith("autosave:")][0].endswith(
        "(--load FILE continues it)")
    assert path.read_bytes() == before
