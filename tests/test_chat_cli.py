"""`llamabatch chat`: piped stdin through main() in-process, the REPL loop with injected
input and prompt-toolkit's pipe input, all on the scripted fake runner; on the bundled
model (marked `model`), piped stdin in a real process and a real terminal (a pty) for Ctrl-C."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.chat.repl import chat_loop
from llamabatch.cli.chat.chat_io import terminal_reader
from llamabatch.chat.session import ChatIO, ChatSession
from cli_harness import invoke, runner_for
from fake_runner import FakeRunner
from llamabatch.chat.ollama_stats import go_duration, parse_stats, stats_lines
from llamabatch.results import Result, Timings, Usage

CHAT = [sys.executable, "-m", "llamabatch", "chat"]


def tokens(value: str) -> int:
    """'18 token(s)' -> 18"""
    return int(value.split()[0])


def conversation_tokens(block: dict[str, str]) -> int:
    """A reply's whole conversation: its prompt (evaluated + cached) and the reply."""
    return tokens(block["prompt eval count"]) + tokens(block["cached tokens"]) + tokens(block["eval count"])


def run_chat(args: list[str], stdin: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run(CHAT + args, input=stdin, capture_output=True, text=True, timeout=300, env=env)


class Script:
    """Scripted ChatIO: input lines, captured output; `interrupt_after` raises KeyboardInterrupt
    in write() after that many reply pieces, as a Ctrl-C during a reply does."""

    def __init__(self, lines: list[str], interrupt_after: int | None = None):
        self.lines = list(lines)
        self.out: list[str] = []
        self.info: list[str] = []
        self.notices: list[str] = []
        self.interrupt_after = interrupt_after

    def read(self, prompt: str) -> str:
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)

    def write(self, text: str) -> None:
        self.out.append(text)
        if self.interrupt_after is not None and len(self.out) >= self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt

    def io(self, interactive: bool = False) -> ChatIO:
        return ChatIO(self.read, self.write, self.info.append, self.notices.append, interactive=interactive)


@pytest.fixture
def engine():
    """One slot of 4096 tokens on the scripted fake runner, with a Gemma architecture (so the
    built-in Gemma template applies, as for the bundled model). Replies are short sentences."""
    runner = FakeRunner(n_slots=1, slot_ctx=4096, metadata={"general.architecture": "gemma3"},
                        reply=lambda prompt: f"A reply to {len(prompt)} characters, one token each.",
                        step_delay=0.001)
    with Engine(EngineConfig(n_parallel=1, n_batch=512), runner=runner) as engine:
        yield engine


def session_for(engine, script: Script, *, max_tokens: int = 8, interactive: bool = False, **kw) -> ChatSession:
    return ChatSession(engine, SamplingParams(max_tokens=max_tokens, temperature=0), script.io(interactive), **kw)


def test_durations_read_like_ollamas():
    assert [go_duration(s) for s in (1.2, 0.035, 62.5, 0.00085, 0, 4.1234567)] == \
        ["1.2s", "35ms", "1m2.5s", "850µs", "0s", "4.123s"]


# -- through the command line -------------------------------------------------------------


def seconds(duration: str) -> float:
    """go_duration's text back to seconds (1m2.5s, 1.2s, 35ms, 850µs, 0s)."""
    minutes, _, rest = duration.rpartition("m") if duration.endswith("s") and "m" in duration[:-2] else ("", "", duration)
    for unit, scale in (("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if rest.endswith(unit):
            return float(minutes or 0) * 60 + float(rest[:-len(unit)]) * scale
    raise ValueError(duration)


def adds_up(block: dict[str, str]) -> bool:
    """Ollama's arithmetic: the total spans the load, the prompt's evaluation and the reply
    (each line rounded to 4 significant digits, hence the slack)."""
    parts = sum(seconds(block[k]) for k in ("load duration", "prompt eval duration", "eval duration"))
    return seconds(block["total duration"]) >= parts * 0.999 - 1e-6


def test_total_duration_counts_the_load_as_ollamas_does():
    # once: "total duration: 313ms" under "load duration: 383ms", and a total of 1.27s
    # beside load 0.435s + prompt eval 1.208s + eval 0.061s
    result = Result(0, "hi", [1], "stop", Usage(prompt_tokens=6, completion_tokens=3),
                    Timings(prompt_ms=1208.0, decode_ms=61.0))
    block = parse_stats("\n".join(stats_lines(result, total_s=1.27, load_s=0.435)))[0]
    assert adds_up(block), block
    assert seconds(block["total duration"]) == pytest.approx(0.435 + 1.27, rel=1e-3)
    # timers that disagree with the wall clock still add up; no load on later replies
    block = parse_stats("\n".join(stats_lines(result, total_s=0.9)))[0]
    assert adds_up(block) and seconds(block["load duration"]) == 0, block


def fake_chat(args: list[str], stdin: str, tmp_path) -> subprocess.CompletedProcess:
    """`llamabatch chat ARGS` in-process with piped stdin, on the scripted fake runner."""
    result = invoke(["chat", *args], input=stdin, runner=runner_for(reply=lambda prompt: f" Reply {len(prompt)}."),
                    env={"XDG_STATE_HOME": str(tmp_path / "state")})
    return subprocess.CompletedProcess(["llamabatch", "chat", *args], result.exit_code, result.stdout, result.stderr)


@pytest.mark.parametrize("which", ["fake", pytest.param("gemma3", marks=pytest.mark.model),
                                   pytest.param("smollm2", marks=pytest.mark.model)])
def test_piped_three_turn_chat_reuses_the_previous_conversation_from_the_cache(tmp_path, request, which):
    # on both model families: Gemma's built-in format (no template in its GGUF) and SmolLM2's ChatML
    chat, model = (fake_chat, []) if which == "fake" else (
        run_chat, ["-m", request.getfixturevalue("model_path" if which == "gemma3" else "smollm2_path")])
    proc = chat(["--verbose", "--max-tokens", "16", "--temperature", "0", *model],
                "Hi, who are you?\nWhat is the capital of France?\nAnd of Germany?\n", tmp_path)
    assert proc.returncode == 0, proc.stderr
    blocks = parse_stats(proc.stderr)
    assert len(blocks) == 3, proc.stderr
    assert all(adds_up(block) for block in blocks), blocks
    assert tokens(blocks[0]["cached tokens"]) == 0
    for before, block in zip(blocks, blocks[1:]):
        cached = tokens(block["cached tokens"])
        assert cached >= 0.9 * conversation_tokens(before), (before, block)
        print(f"cached {cached} of the previous {conversation_tokens(before)} tokens "
              f"({100 * cached / conversation_tokens(before):.1f}%)")
    # Ollama's lines in Ollama's order, with llamabatch's cached line last
    lines = proc.stderr.splitlines()
    i = lines.index(next(line for line in lines if line.startswith("total duration:")))
    assert [line.split(":")[0] for line in lines[i:i + 10]] == [
        "total duration", "load duration", "prompt eval count", "prompt eval duration", "prompt eval rate",
        "eval count", "eval duration", "eval rate", "cached tokens", "total duration"]
    assert lines[i + 8].startswith("cached tokens:        ")
    # stdout holds the replies only: no prompts, no stats, no greeting
    assert proc.stdout.strip() and ">>>" not in proc.stdout and "duration" not in proc.stdout
    assert proc.stdout.endswith("\n")


def test_overflow_drops_the_oldest_turns_and_says_so_in_one_line(tmp_path):
    # a 256-token slot; the fake's one token per character: ~220-token messages overflow it
    # from the second turn on
    turns = [f"Fact {i}: " + "the sea is deep and wide and blue, " * 6 for i in range(6)]
    proc = fake_chat(["--n-ctx", "256", "--max-tokens", "4", "--temperature", "0", "--verbose"],
                     "\n".join(turns) + "\n/show context\n", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(parse_stats(proc.stderr)) == len(turns)  # every turn got its reply
    context = next(line for line in proc.stderr.splitlines() if line.startswith("context: "))
    used, slot_ctx = int(context.split()[1]), int(context.split()[3])
    notices = [line for line in proc.stderr.splitlines() if "context full" in line]
    assert notices, proc.stderr
    for line in notices:
        assert line.startswith("context full: dropped the ") and line.endswith(f"to fit the {slot_ctx}-token context")
    assert used <= slot_ctx - 4


@pytest.mark.model
def test_ctrl_c_in_a_terminal_cancels_the_reply_and_returns_to_the_prompt(tmp_path):
    master, slave = pty.openpty()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "xterm", "NO_COLOR": "1",
           "PROMPT_TOOLKIT_NO_CPR": "1"}  # nobody answers cursor position requests here
    # started with SIGINT ignored, as a parent that ignores it leaves it: Ctrl-C must still cancel
    proc = subprocess.Popen(CHAT + ["--max-tokens", "2000", "--temperature", "0", "--verbose"],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    os.close(slave)
    seen = bytearray()

    def read_some() -> None:
        assert proc.poll() is None, seen.decode(errors="replace")
        if select.select([master], [], [], 0.2)[0]:
            seen.extend(os.read(master, 65536))

    def wait_for(text: bytes, start: int = 0, timeout: float = 120) -> int:
        """Read until `text` shows up after offset `start`; return the offset just past it."""
        deadline = time.monotonic() + timeout
        while text not in seen[start:]:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            read_some()
        return seen.index(text, start) + len(text)

    try:
        prompt_at = wait_for(b">>>")  # prompt-toolkit draws the prompt's space as a cursor move
        os.write(master, b"Write a very long story about a dragon.\r")
        # prompt-toolkit is done with the terminal when it turns bracketed paste off
        mark = wait_for(b"\x1b[?2004l", wait_for(b"dragon.", prompt_at))
        deadline = time.monotonic() + 120
        while len(seen[mark:].decode(errors="replace").strip()) < 20:  # the reply is streaming
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            read_some()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        cancelled_at = wait_for(b"reply cancelled", mark)
        stats_at = wait_for(b"\neval count:", cancelled_at)  # not "prompt eval count:"
        wait_for(b">>>", stats_at)
        os.write(master, b"\x04")  # Ctrl-D at the prompt
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    eval_count = int(seen[stats_at:].split()[0])
    assert 0 < eval_count < 2000
    history = (tmp_path / "state" / "llamabatch" / "chat_history").read_text()
    assert "+Write a very long story about a dragon." in history
    # the exchange was saved as it happened, the partial reply with it
    with sqlite3.connect(tmp_path / "state" / "llamabatch" / "conversations.db") as db:
        rows = db.execute("SELECT role, content, tokens FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "assistant"] and rows[0][1] == "Write a very long story about a dragon."
    assert rows[1][1].strip() and rows[1][2] == eval_count


# -- the loop with injected input ---------------------------------------------------------


def test_each_command(engine):
    script = Script(["/help", "/system Be terse.", "/system", "/set temperature 0.5", "/set top_k 5",
                     "/set top_p 0.9", "/set min_p 0.1", "/set max_tokens 6", "/set seed 7",
                     "/set repeat_penalty 1.1", "/set verbose", "/set seed random", "/set temperature 0",
                     "/show", "/show template", "Hi there", "/retry", "/stats", "/set quiet", "/clear",
                     "/show system", "/bye", "never read"])
    session = session_for(engine, script)
    chat_loop(session)
    assert script.lines == ["never read"]  # /bye ended the chat
    info = "\n".join(script.info)
    assert "/retry" in info and "/load FILE" in info  # /help
    assert session.conversation.system == "Be terse." and "system prompt: 'Be terse.'" in info
    p = session.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.max_tokens, p.seed, p.repeat_penalty) == \
        (0.0, 5, 0.9, 0.1, 6, None, 1.1)
    assert "template: gemma (built-in gemma" in info
    assert any(line.startswith("model: fake-model") for line in script.info)
    assert "parameters:" in script.info and "  temperature     0.0" in script.info
    assert any(line.startswith("context: ") for line in script.info)
    # "Hi there" and /retry: two replies, one exchange in the conversation
    assert session.totals.replies == 2
    assert "replies: 2" in info and "prompt tokens: " in info
    assert len(parse_stats(info)) == 2  # verbose was on for both replies
    assert session.verbose is False
    # /clear started over with the system prompt kept
    assert session.conversation.messages == [] and "system: 'Be terse.'" in info


def test_retry_regenerates_the_last_reply_from_the_cached_prompt(engine):
    script = Script(["Name a colour.", "/retry"])
    session = session_for(engine, script)
    chat_loop(session)
    first_prompt = session.totals.prompt_tokens - session.last_result.usage.prompt_tokens
    assert [m["role"] for m in session.conversation.messages] == ["user", "assistant"]
    assert session.last_result.usage.prompt_tokens == first_prompt
    assert session.last_result.usage.cached_tokens == first_prompt - 1  # all but the token sampled from


def test_bad_commands_and_values_get_one_line_each(engine):
    bad = ["/frobnicate", "/set temperature -1", "/set top_k many", "/set nope 1", "/set", "/set verbose maybe",
           "/show nothing", "/save", "/load", "/load /nonexistent/chat.json", "/retry"]
    script = Script(bad)
    session = session_for(engine, script)
    before = session.params
    for line in bad:
        script.lines = [line]
        count = len(script.info)
        chat_loop(session)
        assert len(script.info) == count + 1, (line, script.info[count:])
        assert "Traceback" not in script.info[-1]
    assert session.params == before and session.totals.replies == 0
    assert script.info[0].startswith("unknown command /frobnicate; commands: /help")
    assert script.info[1] == "/set temperature: temperature must be a number >= 0, got -1.0"


def test_save_then_load_gives_the_same_transcript_and_reevaluates_it_once(engine, tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    script = Script(["Hi!", "What is two plus two?", f"/save {first}", "/clear", f"/load {first}",
                     f"/save {second}", "/set verbose", "Thanks."])
    session = session_for(engine, script, system="You are helpful.")
    chat_loop(session)
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a == b
    assert a["messages"][0] == {"role": "system", "content": "You are helpful."}
    assert [m["role"] for m in a["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert session.conversation.messages[:4] == a["messages"][1:]
    # /load evaluated the transcript in the background; the next turn found it in the cache
    loaded_tokens = len(engine.tokenize(engine.chat_template.render(a["messages"], add_generation_prompt=False),
                                        special=True))
    (block,) = parse_stats("\n".join(script.info))
    assert tokens(block["cached tokens"]) >= 0.9 * loaded_tokens


def test_ctrl_c_during_a_reply_keeps_the_partial_reply_and_goes_on(engine):
    script = Script(["Write a long story about a brave knight.", "/set max_tokens 4", "Go on."], interrupt_after=2)
    session = session_for(engine, script, max_tokens=48, verbose=True)
    results = []
    original_reply = session.reply

    def recording_reply():
        results.append(original_reply())
        return results[-1]

    session.reply = recording_reply
    chat_loop(session)
    cancelled, after = results
    assert cancelled.finish_reason == "cancelled"
    assert 0 < cancelled.usage.completion_tokens < 48
    assert any("reply cancelled" in n for n in script.notices)
    # what was shown is exactly what the conversation keeps, and the chat went on to the next turn
    messages = session.conversation.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == cancelled.text
    shown = "".join(script.out)
    assert shown.startswith(cancelled.text + "\n")
    # the partial reply is in the cache too
    previous = cancelled.usage.prompt_tokens + cancelled.usage.completion_tokens
    assert after.usage.cached_tokens >= 0.9 * previous


def test_prompt_toolkit_terminal_input_drives_the_repl(engine, tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    history = tmp_path / "state" / "chat_history"
    script = Script([])
    with create_pipe_input() as keys:
        read = terminal_reader(history, input=keys, output=DummyOutput())
        io = ChatIO(read, script.write, script.info.append, script.notices.append, interactive=True)
        session = ChatSession(engine, SamplingParams(max_tokens=4, temperature=0), io)
        keys.send_text("Hi\r")
        keys.send_text('"""\rline one\r/not a command\r"""\r')  # a block: never a command
        keys.send_text("first\x1b\rsecond\r")  # Esc-Enter: a new line in the same message
        keys.send_text("half typed\x03")  # Ctrl-C at the prompt: the line is dropped
        keys.send_text("/bye\r")
        chat_loop(session)
    users = [m["content"] for m in session.conversation.messages if m["role"] == "user"]
    assert users == ["Hi", "line one\n/not a command", "first\nsecond"]
    assert session.totals.replies == 3
    assert "Use Ctrl-D or /bye to exit." in script.notices
    assert "".join(script.out).count("\n\n") >= 3  # a blank line after each reply on a terminal
    # history is kept across runs: Up recalls the last entry in a new session
    assert "+first\n+second" in history.read_text()
    with create_pipe_input() as keys:
        read = terminal_reader(history, input=keys, output=DummyOutput())
        keys.send_text("\x1b[A\r")
        assert read(">>> ") == "/bye"
