"""What C code prints on fd 2, caught: llama.cpp's grammar parser complains with
fprintf(stderr), not through the log callback, and a bad grammar is the user's input error
that should come back as one line tied to its request, not as noise on the terminal."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from typing import Iterator

log = logging.getLogger("llamabatch.runner")

_stderr_lock = threading.Lock()

GRAMMAR_COMPLAINT = "error parsing grammar: "


@contextlib.contextmanager
def stderr_captured() -> Iterator[list[str]]:
    """Catch what C code prints on fd 2 during the block (llama.cpp's grammar parser uses fprintf,
    not the log callback). Output other threads print meanwhile is passed on afterwards."""
    said: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to catch
            yield said
            return
        os.dup2(tmp.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            if text:
                said.append(text)
                log.debug("llama.cpp printed: %s", text.rstrip())
                ours = text
                if GRAMMAR_COMPLAINT in text:  # from its line on: the complaint and the grammar echoed
                    before = text[:text.index(GRAMMAR_COMPLAINT)]
                    ours = before[:before.rfind("\n") + 1]
                if ours.strip():
                    os.write(2, ours.encode())


def grammar_complaint(said: list[str]) -> str:
    """'expecting name at ...' from llama.cpp's "parse: error parsing grammar: ...\n\n<grammar>"."""
    for text in said:
        if GRAMMAR_COMPLAINT in text:
            return text.split(GRAMMAR_COMPLAINT, 1)[1].split("\n", 1)[0].strip()
    return ""
