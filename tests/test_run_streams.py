"""`run -o` to a stream: a pipe, a FIFO or /dev/stdout used to be
refused with Python's raw "File or stream is not seekable"; a pipe is a normal place to send
output. --resume cannot read a stream back: refused with one line, before the stream is
opened. In-process on the fake runner."""
from __future__ import annotations

import json
import os
import threading

from cli_harness import invoke, runner_for

FAST = ["--n-parallel", "2", "--max-tokens", "4"]


def read_pipe_in_background(fd_or_path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(fd_or_path, "rb") as f:  # a FIFO's open waits here for the writer
            got.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def lines_in(tmp_path, n: int = 3):
    inp = tmp_path / "in.txt"
    inp.write_text("".join(f"prompt {i}\n" for i in range(n)))
    return inp


def records(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def test_output_to_a_fifo(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader, got = read_pipe_in_background(str(fifo))
    result = invoke(["run", str(lines_in(tmp_path)), "-o", str(fifo), *FAST], runner=runner_for())
    reader.join(20)
    assert result.exit_code == 0, result.stderr
    assert [r["id"] for r in records(got[0])] == [1, 2, 3]
    assert "not seekable" not in result.stderr


def test_output_to_dev_stdout_when_stdout_is_a_pipe(tmp_path):
    r, w = os.pipe()
    saved = os.dup(1)
    reader, got = read_pipe_in_background(r)
    try:
        os.dup2(w, 1)  # fd 1 is a pipe, as in `llamabatch run in -o /dev/stdout | jq`
        os.close(w)
        result = invoke(["run", str(lines_in(tmp_path)), "-o", "/dev/stdout", *FAST], runner=runner_for())
    finally:
        os.dup2(saved, 1)  # closes the pipe's last write end: the reader sees EOF
        os.close(saved)
    reader.join(20)
    assert result.exit_code == 0, result.stderr
    assert [r["id"] for r in records(got[0])] == [1, 2, 3]


def test_output_to_an_inherited_pipe_fd(tmp_path):
    r, w = os.pipe()
    reader, got = read_pipe_in_background(r)
    try:
        result = invoke(["run", str(lines_in(tmp_path)), "-o", f"/dev/fd/{w}", *FAST], runner=runner_for())
    finally:
        os.close(w)
    reader.join(20)
    assert result.exit_code == 0, result.stderr
    assert len(records(got[0])) == 3


def test_resume_to_a_fifo_is_refused_in_one_line_without_opening_it(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    # no reader: opening the FIFO would block, so a pass here also shows it was never opened
    result = invoke(["run", str(lines_in(tmp_path)), "-o", str(fifo), "--resume", *FAST], runner=runner_for())
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"llamabatch: error: cannot resume: OUTPUT {fifo} is a FIFO (named pipe), not a regular file; "
        "--resume reads OUTPUT back, so give it the file the earlier run wrote"]
