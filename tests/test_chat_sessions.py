"""Saved chats on the scripted fake runner: the SQLite conversation log, -c/--resume/--load,
--list/--search, one-shot prompts with piped material, Ollama's /set parameter and /show,
/undo, two writer processes at once, and a damaged or newer database (one line, file untouched)."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.chat.autosave import Autosave
from llamabatch.chat.repl import chat_loop
from llamabatch.chat.ollama_stats import parse_stats
from llamabatch.chat.session import ChatIO, ChatSession
from llamabatch.chat.store import SCHEMA_VERSION, Store, StoreError
from cli_harness import invoke, runner_for
from fake_runner import FakeRunner

TESTS = Path(__file__).resolve().parent


def tokens(value: str) -> int:
    return int(value.split()[0])


def chat(tmp_path, args: list[str], stdin: str = "", *, stdin_isatty: bool = False):
    """`llamabatch chat ARGS` in-process on the fake runner, state under tmp_path."""
    return invoke(["chat", "--temperature", "0", "--max-tokens", "32", *args], input=stdin,
                  runner=runner_for(reply=lambda prompt: f" Reply to {len(prompt)}."),
                  env={"XDG_STATE_HOME": str(tmp_path / "state")}, stdin_isatty=stdin_isatty)


def db_path(tmp_path) -> Path:
    return tmp_path / "state" / "llamabatch" / "conversations.db"


def stored_messages(tmp_path) -> dict[int, list[tuple[str, str]]]:
    with sqlite3.connect(db_path(tmp_path)) as db:
        rows = db.execute("SELECT conversation_id, role, content FROM messages ORDER BY id").fetchall()
    out: dict[int, list[tuple[str, str]]] = {}
    for cid, role, content in rows:
        out.setdefault(cid, []).append((role, content))
    return out


# -- the store ------------------------------------------------------------------------------


def test_a_new_database_has_the_schema_version_wal_and_full_text_search(tmp_path):
    store = Store(tmp_path / "c.db")
    cid = store.new_conversation(model="m", template="t", settings={"temperature": 0}, system="Be brief.")
    ids = store.change(cid, add=[{"role": "user", "content": "Where do penguins live?"},
                                 {"role": "assistant", "content": "Mostly in the southern hemisphere.",
                                  "tokens": 7, "prompt_tokens": 20, "cached_tokens": 3,
                                  "timings": {"prompt_ms": 1.5, "decode_ms": 9.0}}])
    store.change(cid, delete=[ids[1]], add=[{"role": "assistant", "content": "Antarctica."}])
    assert [s.id for s in store.search("penguins")] == [cid]
    assert store.search("southern") == []  # deleted messages leave the index too
    assert store.search('"quoted') == []  # search text is words, never FTS syntax
    stored = store.read(cid)
    assert stored.system == "Be brief." and [m["content"] for m in stored.messages] == \
        ["Where do penguins live?", "Antarctica."]
    store.close()
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT tokens, prompt_tokens, cached_tokens FROM messages").fetchall() == [(None, None, None)] * 2


@pytest.mark.parametrize("damage", ["garbage", "newer", "torn"])
def test_a_damaged_or_newer_database_is_one_line_and_left_as_it_is(tmp_path, damage):
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True)
    if damage == "garbage":
        path.write_bytes(b"this is not a database\n" * 100)
        expected = "is not a SQLite database"
    elif damage == "newer":
        with sqlite3.connect(path) as db:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
        expected = f"written by a newer llamabatch (schema {SCHEMA_VERSION + 5}"
    else:  # a real header, then garbage where the pages should be
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 8000)
        expected = "cannot read"
    before = path.read_bytes()
    # --list and -c need the database: one line, exit 1
    for args in (["--list"], ["--search", "x"], ["-c", "Hi"]):
        result = chat(tmp_path, args)
        assert result.exit_code == 1, result.stderr
        assert result.stderr.count("\n") == 1 and expected in result.stderr and "Traceback" not in result.stderr
    # a new chat goes on, says so in one line, and keeps the conversation in a JSON file instead
    result = chat(tmp_path, [], "Hello there.\nAnd again.\n")
    assert result.exit_code == 0, result.stderr
    notices = [line for line in result.stderr.splitlines() if line.startswith("autosave:")]
    assert len(notices) == 1 and expected in notices[0], result.stderr
    saved = Path(notices[0].split(" goes to ")[1].split(" instead")[0])
    users = [m["content"] for m in json.loads(saved.read_text())["messages"] if m["role"] == "user"]
    assert users == ["Hello there.", "And again."]
    assert path.read_bytes() == before  # never overwritten
    assert chat(tmp_path, ["--load", str(saved), "--no-save", "Go on."]).exit_code == 0


def test_a_store_that_fails_mid_chat_keeps_the_conversation_in_a_json_file(tmp_path):
    runner = FakeRunner(n_slots=1, slot_ctx=1024, reply=lambda p: " ok")
    lines, notices = [], []
    with Engine(EngineConfig(n_parallel=1), runner=runner) as engine:
        io = ChatIO(lambda prompt: lines.pop(0) if lines else (_ for _ in ()).throw(EOFError()),
                    lambda text: None, notices.append, notices.append)
        session = ChatSession(engine, SamplingParams(max_tokens=8, temperature=0), io)
        store = Store(tmp_path / "c.db")
        session.autosave = Autosave(store, meta=lambda: {"model": "m", "template": "t", "settings": {}},
                                    notice=notices.append, fallback_dir=tmp_path / "fallback")
        session.say("first")

        def broken(*args, **kwargs):
            raise StoreError("cannot write c.db: disk I/O error")

        store.change = broken
        session.say("second")
        session.say("third")
    (line,) = [n for n in notices if n.startswith("autosave:")]
    assert "disk I/O error" in line
    (saved,) = (tmp_path / "fallback").iterdir()
    assert [m["content"] for m in json.loads(saved.read_text())["messages"]] == \
        ["first", " ok", "second", " ok", "third", " ok"]


# -- through the command line ---------------------------------------------------------------


def test_piped_turns_are_saved_and_continue_listed_and_found(tmp_path):
    first = chat(tmp_path, ["--system", "You are terse."], "Tell me about penguins.\nAnd seals?\n")
    assert first.exit_code == 0, first.stderr
    again = chat(tmp_path, ["-c", "--verbose"], "And walruses?\n")
    assert again.exit_code == 0, again.stderr
    assert "continuing conversation 1: 4 messages" in again.stderr
    (block,) = parse_stats(again.stderr)
    assert tokens(block["cached tokens"]) > 0.9 * (tokens(block["prompt eval count"]) + tokens(block["cached tokens"])) - 20
    other = chat(tmp_path, [], "Something else entirely.\n")
    assert other.exit_code == 0
    assert stored_messages(tmp_path)[1][0::2] == [("user", "Tell me about penguins."), ("user", "And seals?"),
                                                   ("user", "And walruses?")]
    listing = chat(tmp_path, ["--list"])
    assert listing.exit_code == 0 and listing.stderr == ""
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["ID", "WHEN", "MODEL", "MSGS", "FIRST", "LINE"]
    assert [r.split()[0] for r in rows] == ["2", "1"]  # newest first
    assert rows[1].split()[4] == "6" and rows[1].endswith("Tell me about penguins.")
    found = chat(tmp_path, ["--search", "walruses"])
    assert [r.split()[0] for r in found.stdout.splitlines()[1:]] == ["1"] and "walruses" in found.stdout
    assert chat(tmp_path, ["--search", "narwhals"]).stdout == ""
    resumed = chat(tmp_path, ["--resume", "1", "One more."])
    assert resumed.exit_code == 0 and len(stored_messages(tmp_path)[1]) == 8
    assert chat(tmp_path, ["--resume", "99", "Hi"]).stderr == \
        "llamabatch: error: no saved conversation 99 (llamabatch chat --list shows them)\n"
    with sqlite3.connect(db_path(tmp_path)) as db:
        assert db.execute("SELECT system FROM conversations WHERE id = 1").fetchone() == ("You are terse.",)


def test_one_shot_prints_the_reply_and_takes_piped_material(tmp_path):
    result = chat(tmp_path, ["summarise this"], "Line one of the notes.\nLine two.\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(" Reply to ") and result.stdout.endswith(".\n")
    (messages,) = stored_messages(tmp_path).values()
    assert messages[0] == ("user", "Line one of the notes.\nLine two.\n\nsummarise this")
    # on a terminal there is no material; -c continues the one-shot's conversation
    follow = chat(tmp_path, ["-c", "and shorter"], stdin_isatty=True)
    assert follow.exit_code == 0 and follow.stdout.count("\n") == 1
    assert [m for m in stored_messages(tmp_path)[1] if m[0] == "user"][1] == ("user", "and shorter")


def test_no_save_records_nothing(tmp_path):
    result = chat(tmp_path, ["--no-save"], "Hi.\nBye.\n")
    assert result.exit_code == 0 and not db_path(tmp_path).exists()
    chat(tmp_path, [], "Saved.\n")
    chat(tmp_path, ["--no-save", "-c"], "Not saved.\n")
    assert stored_messages(tmp_path) == {1: [("user", "Saved."), ("assistant", " Reply to 24.")]}


def test_conflicting_starting_points_are_a_usage_error(tmp_path):
    result = chat(tmp_path, ["-c", "--resume", "1"])
    assert result.exit_code == 2 and result.stderr == \
        "llamabatch: error: use one of --continue, --resume ID and --load FILE\n"
    assert chat(tmp_path, ["-c", "Hi"]).stderr == "llamabatch: error: no saved conversation to continue yet\n"


def test_a_saved_conversation_that_is_not_there_is_a_typed_error_in_the_library(tmp_path, monkeypatch):
    from llamabatch.chat.saved import read_stored
    from llamabatch.errors import ConversationNotFound

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert read_stored(False, None) is None  # nothing asked for: nothing read
    with pytest.raises(ConversationNotFound, match="^no saved conversation to continue yet$"):
        read_stored(True, None)
    assert chat(tmp_path, [], "Saved.\n").exit_code == 0
    assert read_stored(True, None).messages[0] == {"role": "user", "content": "Saved."}
    with pytest.raises(ConversationNotFound) as missing:
        read_stored(False, 7)
    assert missing.value.code == "not_found" and "no saved conversation 7" in str(missing.value)


# -- Ollama's spellings and /undo -------------------------------------------------------------


@pytest.fixture
def engine():
    runner = FakeRunner(n_slots=1, slot_ctx=2048, reply=lambda prompt: "a fairly long reply " * 10,
                        metadata={"general.architecture": "gemma3", "general.size_label": "270M",
                                  "general.file_type": "15", "gemma3.context_length": "32768"})
    with Engine(EngineConfig(n_parallel=1), runner=runner) as engine:
        yield engine


def run_lines(engine, lines: list[str], tmp_path, **kw) -> tuple[ChatSession, list[str]]:
    info: list[str] = []
    pending = list(lines)

    def read(prompt: str) -> str:
        if not pending:
            raise EOFError
        return pending.pop(0)

    session = ChatSession(engine, SamplingParams(max_tokens=64, temperature=0),
                          ChatIO(read, lambda text: None, info.append, info.append), **kw)
    store = Store(tmp_path / "c.db")
    session.autosave = Autosave(store, meta=lambda: {"model": "m", "template": "t", "settings": {}},
                                notice=info.append, fallback_dir=tmp_path)
    chat_loop(session)
    store.close()
    return session, info


def test_ollama_set_parameter_and_show(engine, tmp_path):
    session, info = run_lines(engine, [
        "/set parameter num_predict 5", "Hi", "/set parameter temperature 0.3", "/set parameter top_k 7",
        "/set parameter top_p 0.5", "/set parameter min_p 0.2", "/set parameter repeat_penalty 1.2",
        "/set parameter seed 11", '/set parameter stop "<end>" "\\n\\n"', "/set parameter num_ctx 1000",
        "/set parameter num_ctx 9000", "/set parameter nope 1", "/set system Be kind.", "/show info",
        "/show parameters", "/show system", "/show template", "/show context"], tmp_path)
    assert session.last_result.usage.completion_tokens == 5
    p = session.params
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.seed, p.stop) == \
        (5, 0.3, 7, 0.5, 0.2, 1.2, 11, ["<end>", "\n\n"])
    assert session.num_ctx == 1000 and session.builder.budget(5) == 995
    assert "/set num_ctx: 9000 tokens is more than this chat's 2048-token slot; that takes a restart: " \
           "/bye, then `llamabatch chat -c --n-ctx 9000` continues this conversation" in info
    assert any(line.startswith("/set nope: ") or line.startswith("usage: /set PARAM") for line in info)
    assert session.conversation.system == "Be kind."
    i = info.index("info:")
    assert info[i + 1:i + 7] == ["  model           fake-model", "  architecture    gemma3", "  parameters      270M",
                                 "  quantization    Q4_K_M",
                                 "  context length  1000 (this chat's slot: 2048; trained for 32768)",
                                 "  template        gemma"]
    assert '  num_predict     5' in info and '  stop            "<end>" "\\n\\n"' in info and "  num_ctx         1000" in info
    assert "system: 'Be kind.'" in info and any(line.startswith("template: gemma") for line in info)
    assert any(line.startswith("context: ") and " of 1000 tokens" in line for line in info)


def test_undo_drops_the_last_exchange_and_the_next_turn_reuses_the_cache(engine, tmp_path):
    session, info = run_lines(engine, ["First question.", "Second question.", "/undo", "Another second."],
                              tmp_path, verbose=True)
    users = [m["content"] for m in session.conversation.messages if m["role"] == "user"]
    assert users == ["First question.", "Another second."]
    assert "dropped the last exchange (2 messages left)" in info
    first, second, after = parse_stats("\n".join(info))
    # the turn after /undo finds the first exchange in the slot: all of its prompt and reply
    first_total = tokens(first["prompt eval count"]) + tokens(first["cached tokens"]) + tokens(first["eval count"])
    assert tokens(after["cached tokens"]) >= first_total
    assert tokens(after["prompt eval count"]) <= len("Another second.") + 40  # the new message and its markup
    # the log agrees
    with sqlite3.connect(tmp_path / "c.db") as db:
        rows = db.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    assert [c for r, c in rows if r == "user"] == ["First question.", "Another second."]
    _, info = run_lines(engine, ["/undo", "/undo"], tmp_path)
    assert info == ["nothing to undo: no exchange yet"] * 2


# -- two writers ----------------------------------------------------------------------------

WRITER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from cli_harness import invoke, runner_for
open(os.path.join(sys.argv[2], "ready-" + sys.argv[1]), "w").close()
while not os.path.exists(os.path.join(sys.argv[2], "go")):  # start both chats together
    time.sleep(0.01)
turns = "".join(f"{{sys.argv[1]}} turn {{i}}\\n" for i in range({turns}))
result = invoke(["chat", "--max-tokens", "2", "--temperature", "0"], input=turns,
                runner=runner_for(reply=lambda prompt: " ok", step_delay=0.01),  # turns that take time, like a model's
                env={{"XDG_STATE_HOME": sys.argv[2]}})
print(result.stderr, file=sys.stderr)
sys.exit(result.exit_code)
"""


def test_two_chat_processes_writing_at_once_keep_all_their_turns(tmp_path):
    turns = 40
    script = textwrap.dedent(WRITER.format(tests=str(TESTS), turns=turns))
    state = tmp_path / "state"
    state.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", script, name, str(state)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("alpha", "beta")]
    deadline = time.monotonic() + 60
    while not all((state / f"ready-{name}").exists() for name in ("alpha", "beta")):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    (state / "go").touch()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "autosave" not in err, err
    by_conversation = stored_messages(tmp_path)
    assert len(by_conversation) == 2
    users = sorted([c for r, c in messages if r == "user"] for messages in by_conversation.values())
    assert users == [[f"alpha turn {i}" for i in range(turns)], [f"beta turn {i}" for i in range(turns)]]
    with sqlite3.connect(db_path(tmp_path)) as db:  # they did write at the same time
        order = [cid for (cid,) in db.execute("SELECT conversation_id FROM messages ORDER BY id")]
    switches = sum(a != b for a, b in zip(order, order[1:]))
    print(f"the writers took turns {switches} times in {len(order)} rows")
    assert switches >= 2


def _open_and_write(path: str, barrier, results) -> None:
    barrier.wait()  # both open the not-yet-existing database at the same instant
    try:
        store = Store(path)
        cid = store.new_conversation(model="m", template="t", settings={}, system=None)
        store.change(cid, add=[{"role": "user", "content": "hello"}])
        store.close()
        results.put("ok")
    except StoreError as exc:
        results.put(str(exc))


def test_two_chats_creating_the_database_at_the_same_instant_both_open_it(tmp_path):
    # Switching a new database to WAL answers "database is locked" without waiting when a
    # second connection opens it at that moment; before the retry 1 start in 4 lost its log.
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    failures = []
    for round_ in range(40):
        path = str(tmp_path / f"round-{round_}.db")
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_open_and_write, args=(path, barrier, results)) for _ in range(2)]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        failures += [o for o in outcomes if o != "ok"]
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == outcomes.count("ok")
    assert failures == []
