"""A Python co-process client for `llamabatch serve-stdin`.

One model stays loaded in a child process; any thread may submit requests, and a reader
thread routes each event line to the request it belongs to. Run it (any further arguments
are serve-stdin options, e.g. --model or --threads):

    python examples/serve_client.py
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable

# `llamabatch serve-stdin ...` works the same where the command is on PATH.
COMMAND = [sys.executable, "-m", "llamabatch", "serve-stdin", "--n-parallel", "4"]


class LlamaBatch:
    def __init__(self, command: list[str] = COMMAND):
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, encoding="utf-8", bufsize=1)
        self._write_lock = threading.Lock()  # several threads may submit; each line must stay whole
        self._pending: dict[str, tuple[Future, Callable[[str], None] | None]] = {}
        self._stats: list[Future] = []
        self._ids = itertools.count(1)
        self.ready: Future = Future()
        threading.Thread(target=self._read_events, daemon=True).start()
        self.info = self.ready.result(timeout=120)  # {"event": "ready", "model": ..., "n_parallel": ...}

    def submit(self, prompt: str | None = None, *, messages: list[dict] | None = None,
               on_token: Callable[[str], None] | None = None, **sampling: Any) -> Future:
        """Send one request; the Future resolves to its `done` event or raises on its `error` event."""
        request_id = f"req-{next(self._ids)}"
        request: dict[str, Any] = {"id": request_id, **sampling}
        request["messages" if messages is not None else "prompt"] = messages if messages is not None else prompt
        if on_token is not None:
            request["stream"] = True
        future: Future = Future()
        self._pending[request_id] = (future, on_token)
        self._send(request)
        return future

    def stats(self) -> dict[str, Any]:
        future: Future = Future()
        self._stats.append(future)
        self._send({"op": "stats"})
        return future.result(timeout=60)

    def close(self) -> int:
        """End of input: the server finishes what is in flight, then exits."""
        self._proc.stdin.close()
        return self._proc.wait()

    def _send(self, message: dict[str, Any]) -> None:
        with self._write_lock:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()

    def _read_events(self) -> None:
        for line in self._proc.stdout:
            event = json.loads(line)
            kind = event["event"]
            if kind == "ready":
                self.ready.set_result(event)
            elif kind == "stats":
                self._stats.pop(0).set_result(event)
            elif kind == "token":
                on_token = self._pending[event["id"]][1]
                if on_token is not None:
                    on_token(event["text"])
            elif kind in ("done", "error") and "op" not in event and event.get("id") in self._pending:
                future, _ = self._pending.pop(event["id"])
                if kind == "done":
                    future.set_result(event)
                else:
                    future.set_exception(RuntimeError(f"{event['error']['code']}: {event['error']['message']}"))
            else:  # an error answering a control line, e.g. cancelling an id that already finished
                print(f"server: {event}", file=sys.stderr)
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("llamabatch serve-stdin exited before it was ready"))


def main() -> int:
    client = LlamaBatch(COMMAND + sys.argv[1:])
    print(f"model {client.info['model']}, {client.info['n_parallel']} slots")
    streamed: list[str] = []
    futures = [
        client.submit("The three primary colours are", max_tokens=24, temperature=0, on_token=streamed.append),
        client.submit("def add(a, b):", max_tokens=24, temperature=0, stop=["\n\n"]),
        client.submit(messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=16, temperature=0),
    ]
    for future in futures:  # all three were generated together; collect them in order
        done = future.result(timeout=300)
        print(f"[done] {done['id']} ({done['finish_reason']}, {done['usage']['completion_tokens']} tokens): "
              f"{done['text'].strip()!r}")
    assert "".join(streamed) == futures[0].result()["text"]  # the streamed pieces join to the final text
    stats = client.stats()
    print(f"stats: {stats['finished']} finished, {stats['generated_tokens']} tokens generated, "
          f"at most {stats['max_decode_tokens_per_tick']} decoded in one tick")
    return client.close()


if __name__ == "__main__":
    sys.exit(main())
