"""Soak: thousands of mixed requests through ONE `llamabatch serve-stdin` process, checking
that every request line is answered exactly once and that memory levels off.

    python benchmarks/soak.py [--requests 2000] [--inflight 32] [--n-parallel 8] [--seed 16]

The mix: random prompt lengths (3 to 80 words, up to about 100 tokens) and output lengths
(1-16 tokens), kept short because what a soak tests is the protocol and memory over many
requests, not the engine's speed; 10% are cancelled shortly after they are sent; 5% are invalid (a bad field
value or a line cut off mid-JSON, each still naming its id); 5% have a timeout short enough
to fire; 3% reuse the id of a request still in flight (a duplicate). The child's RSS is read
from /proc every 100 answered requests.

Prints: requests answered / sent, the distribution of answers per request line (must be
exactly 1), outcomes by kind, and RSS at 200 and at the end with the growth in between.
Exit 1 if any line was not answered exactly once. Measures only; asserts no timing.

`--mix hostile` adds faults to the same requests: the engine child is stopped (SIGSTOP) at
evenly spaced points (`--stops`, default 2) and serve-stdin runs with `--watchdog` (default
10 s here), which must kill and replace it; the requests in flight are retried. It also
prints the longest time with request lines outstanding and no answer (must stay near the
watchdog bound plus a restart, not grow without end) and checks that no engine child
outlives serve-stdin. Hostile requests join the mix too: 2% carry a `json_schema` enum of
2,000 strings with a 20 s timeout (a slow grammar, sampled apart: it must not stall the
others), 2% are chat messages whose template render runs away (serve-stdin gets a
`--chat-template` that loops 10^10 times for a message containing LOOP-FOREVER: that line's
invalid_request, within the template budget), and 3% are ordinary chat messages through the
same template.

A full run takes a while (about 1 s per request on a shared 2-core machine), so
a progress line goes to stderr every 100 answers; and if request lines stay unanswered with no
answer at all for --stall-seconds, it stops and names them (a stall is a verdict, not a wait).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _bench import llamabatch_command, machine_line, workload_args

WORDS = ("river stone market lantern winter orchard signal harbor copper meadow engine violet "
         "thunder basket compass ribbon glacier pepper candle falcon").split()


def _own_rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:  # the process ended between listing and reading
        pass
    return 0


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except OSError:
            pass
    return kids


def engine_children(pid: int) -> list[int]:
    """serve-stdin's supervised engine child (normally one; none between a death and a restart)."""
    found = []
    for kid in _children(pid):
        try:
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                if b"engine-child" in f.read():
                    found.append(kid)
        except OSError:
            pass
    return found


def is_gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def note_death(pid: int, stopped_at: float, deaths: dict[int, float]) -> None:
    """Record how long a stopped engine child lived: the watchdog's reaction time."""
    while not is_gone(pid):
        time.sleep(0.1)
    deaths[pid] = time.monotonic() - stopped_at


def rss_kib(pid: int) -> int:
    """RSS of serve-stdin and every process under it: by default the engine (and its model)
    lives in a supervised child process, so the parent alone would hide what matters."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += _own_rss_kib(p)
        todo += _children(p)
    return total


class Child:
    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(llamabatch_command("serve-stdin", *args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.cond = threading.Condition()
        self.answers: collections.Counter = collections.Counter()  # id -> answer events (terminal or duplicate)
        self.outcomes: collections.Counter = collections.Counter()
        self.answered = 0
        self.last_answer_at = time.monotonic()
        self.longest_gap = 0.0  # the longest time between two answers (or the start and the first)
        self.answer_times: list[float] = []
        self.ready = threading.Event()
        self.stderr = b""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: setattr(self, "stderr", self.proc.stderr.read()), daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            event = json.loads(raw)
            kind = event["event"]
            with self.cond:
                if kind == "ready":
                    self.last_answer_at = time.monotonic()  # the stall clock starts once the model is loaded
                    self.ready.set()
                elif kind in ("done", "error") and "op" not in event:
                    self.answers[event.get("id")] += 1
                    self.answered += 1
                    now = time.monotonic()
                    self.longest_gap = max(self.longest_gap, now - self.last_answer_at)
                    self.last_answer_at = now
                    self.answer_times.append(now)
                    self.outcomes[event["error"]["code"] if kind == "error" else event["finish_reason"]] += 1
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def send(self, line: str) -> None:
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()


# --mix hostile's chat template: ChatML, except that a message containing LOOP-FOREVER sends
# the render into 10^10 loop steps (the template budget must stop it)
HOSTILE_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if 'LOOP-FOREVER' in m['content'] -%}"
    "{%- for i in range(100000) -%}{%- for j in range(100000) -%}{%- endfor -%}{%- endfor -%}"
    "{%- endif -%}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "<|im_start|>assistant\n")
SLOW_ENUM = {"enum": [f"v{i}" for i in range(2000)]}


def make_request(rng: random.Random, req_id: str, hostile: bool = False) -> tuple[str, str]:
    """(line, kind) for one request."""
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.choice([3, 10, 30, 80])))
    if hostile:
        roll = rng.random()
        if roll < 0.02:
            return json.dumps({"id": req_id, "prompt": prompt, "json_schema": SLOW_ENUM, "timeout": 20,
                               "max_tokens": 4}), "slow grammar"
        if roll < 0.04:
            return json.dumps({"id": req_id, "messages": [{"role": "user", "content": "LOOP-FOREVER " + prompt}],
                               "max_tokens": 2}), "runaway template"
        if roll < 0.07:
            return json.dumps({"id": req_id, "messages": [{"role": "user", "content": prompt}],
                               "max_tokens": rng.randint(1, 8)}), "chat"
    req: dict[str, Any] = {"id": req_id, "prompt": prompt, "max_tokens": rng.randint(1, 16),
                           "temperature": rng.choice([0, 0.7]), "stream": rng.random() < 0.3}
    roll = rng.random()
    if roll < 0.025:
        req["top_p"] = 7  # out of range: invalid_request with the id
        return json.dumps(req), "invalid"
    if roll < 0.05:
        return json.dumps(req)[:-12], "invalid"  # cut off mid-JSON: invalid_json, the id read from the text
    if roll < 0.10:
        req.update(timeout=0.05, max_tokens=64, ignore_eos=True)
        return json.dumps(req), "timeout"
    return json.dumps(req), "plain"


def stalled(child: Child, stall_s: float) -> bool:
    """Called with child.cond held, while lines are outstanding."""
    return time.monotonic() - child.last_answer_at > stall_s


def report_stall(child: Child, sent: collections.Counter, lines: dict[str, str], stall_s: float) -> int:
    with child.cond:
        missing = {i: n - child.answers[i] for i, n in sent.items() if child.answers[i] < n}
    print(f"STALL: no answer for {stall_s:.0f}s with {len(missing)} request lines unanswered:", file=sys.stderr)
    for req_id in list(missing)[:20]:
        print(f"  {req_id}: {lines[req_id][:200]}", file=sys.stderr)
    child.proc.kill()
    print(f"serve-stdin stderr (last 2000 chars): {child.stderr.decode(errors='replace')[-2000:]}", file=sys.stderr)
    return 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--n-parallel", type=int, default=8)
    workload_args(ap, threads=2)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--stall-seconds", type=float, default=300,
                    help="stop and name the unanswered lines after this long without any answer")
    ap.add_argument("--mix", choices=("plain", "hostile"), default="plain",
                    help="hostile: also stop the engine child (SIGSTOP) --stops times (the watchdog must replace it), slow grammars and a runaway chat template")
    ap.add_argument("--stops", type=int, default=2, help="hostile: how many times the engine child is stopped")
    ap.add_argument("--watchdog", type=float, default=None,
                    help="serve-stdin's --watchdog [default: its own; 10 with --mix hostile]")
    args = ap.parse_args()
    print(f"soak: {args.requests} requests, {args.n_parallel} slots, {args.threads} threads, mix {args.mix}; "
          f"{machine_line()}", flush=True)
    rng = random.Random(args.seed)
    watchdog = args.watchdog if args.watchdog is not None else (10.0 if args.mix == "hostile" else None)
    template_args = []
    if args.mix == "hostile":
        template = Path(tempfile.mkdtemp(prefix="soak-")) / "runaway.jinja"
        template.write_text(HOSTILE_TEMPLATE)
        template_args = ["--chat-template", str(template)]
    child = Child(["--n-parallel", str(args.n_parallel), "--n-ctx", str(512 * args.n_parallel),
                   "--threads", str(args.threads)] + (["--watchdog", f"{watchdog:g}"] if watchdog is not None else [])
                  + template_args)
    if not child.ready.wait(180):
        raise SystemExit(f"serve-stdin did not start: {child.stderr.decode(errors='replace')[-500:]}")
    sent: collections.Counter = collections.Counter()  # id -> lines sent with it
    lines: dict[str, str] = {}  # id -> the last request line sent with it (for a stall report)
    kinds: collections.Counter = collections.Counter()
    open_ids: list[str] = []  # ids sent recently (duplicates reuse one, cancels target one)
    rss: dict[int, int] = {0: rss_kib(child.proc.pid)}
    next_sample = 100
    start = time.monotonic()
    lines_sent = 0
    # hostile: stop the engine child when these many requests have been sent
    stop_at = {args.requests * (i + 1) // (args.stops + 1) for i in range(args.stops)} if args.mix == "hostile" else set()
    stopped: list[tuple[int, float]] = []  # (engine child, when) stopped: each must be killed by the watchdog
    deaths: dict[int, float] = {}  # stopped child -> seconds from its SIGSTOP to its death
    seen_engines: set[int] = set(engine_children(child.proc.pid))
    for k in range(args.requests):
        if k in stop_at:
            engines = engine_children(child.proc.pid)
            if engines:
                os.kill(engines[0], signal.SIGSTOP)
                stopped.append((engines[0], time.monotonic()))
                threading.Thread(target=note_death, args=(*stopped[-1], deaths), daemon=True).start()
                print(f"  ... stopped the engine child {engines[0]} after {k} requests sent", file=sys.stderr,
                      flush=True)
        seen_engines.update(engine_children(child.proc.pid))
        with child.cond:  # keep at most --inflight request lines unanswered
            while lines_sent - child.answered >= args.inflight and child.proc.poll() is None:
                if stalled(child, args.stall_seconds):
                    break
                child.cond.wait(0.5)
            answered = child.answered
            is_stalled = lines_sent > child.answered and stalled(child, args.stall_seconds)
        if is_stalled:
            return report_stall(child, sent, lines, args.stall_seconds)
        if child.proc.poll() is not None:
            break
        while answered >= next_sample:
            rss[next_sample] = rss_kib(child.proc.pid)
            print(f"  ... {next_sample} answered in {time.monotonic() - start:.0f}s, "
                  f"RSS {rss[next_sample] / 1024:.0f} MiB", file=sys.stderr, flush=True)
            next_sample += 100
        if open_ids and rng.random() < 0.03:
            req_id = rng.choice(open_ids[-args.inflight:])  # a duplicate of a (probably) in-flight id
            line, kind = json.dumps({"id": req_id, "prompt": "duplicate", "max_tokens": 2}), "duplicate"
        else:
            req_id = f"s{k}"
            line, kind = make_request(rng, req_id, hostile=args.mix == "hostile")
        child.send(line)
        lines_sent += 1
        sent[req_id] += 1
        lines[req_id] = line
        kinds[kind] += 1
        open_ids.append(req_id)
        if kind == "plain" and rng.random() < 0.10:
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0, 0.05))  # sometimes after it started, sometimes before
            child.send(json.dumps({"op": "cancel", "id": req_id}))
            kinds["cancel sent"] += 1
    with child.cond:  # everything answered: the last RSS sample, then EOF
        while child.answered < lines_sent and child.proc.poll() is None:
            if stalled(child, args.stall_seconds):
                break
            child.cond.wait(0.5)
        final = child.answered
    if final < lines_sent and child.proc.poll() is None:
        return report_stall(child, sent, lines, args.stall_seconds)
    if child.proc.poll() is None:
        rss[final] = rss_kib(child.proc.pid)
    seen_engines.update(engine_children(child.proc.pid))
    child.proc.stdin.close()  # EOF: drain what is in flight, then exit
    code = child.proc.wait(timeout=600)
    wall = time.monotonic() - start
    time.sleep(2)  # an engine child dies with serve-stdin at once; give the kernel a moment to say so
    orphans = [p for p in seen_engines if not is_gone(p)]
    with child.cond:
        per_line = collections.Counter(child.answers[i] - sent[i] for i in sent)
        extra = [i for i in child.answers if i not in sent]
        answered = child.answered
        outcomes = dict(child.outcomes)
    exact = per_line.get(0, 0) == len(sent) and not extra
    print(f"soak: {lines_sent} request lines ({len(sent)} ids) in {wall:.0f}s, serve-stdin exit {code}")
    print(f"  answered: {answered} / {lines_sent} sent; ids answered exactly as often as sent: "
          f"{per_line.get(0, 0)} / {len(sent)}" + (f"; answers for unknown ids: {extra[:5]}" if extra else ""))
    if not exact:
        print(f"  MISMATCH (answers minus lines, per id): {dict(per_line)}")
    print(f"  sent by kind: {dict(kinds)}")
    print(f"  outcomes: {outcomes}")
    if args.mix == "hostile":
        print(f"  hostile: engine child stopped {len(stopped)} time(s); watchdog {watchdog:g}s; "
              f"longest time with no answer: {child.longest_gap:.1f}s; engine children seen: {len(seen_engines)}, "
              f"left running after serve-stdin exited: {len(orphans)}" + (f" {orphans}" if orphans else ""))
        for pid, at in stopped:
            after = [t - at for t in child.answer_times if t > at + deaths.get(pid, 0)]
            print(f"  stopped {pid}: killed {deaths[pid]:.1f}s after its SIGSTOP" if pid in deaths
                  else f"  stopped {pid}: NOT killed", end="")
            print(f", next answer {after[0]:.1f}s after the SIGSTOP" if after else "")
        for line in child.stderr.decode(errors="replace").splitlines():
            if "by the watchdog" in line:
                print(f"  serve-stdin: {line.strip()[:300]}")
    samples = sorted(rss)
    print("  RSS MiB by requests answered: " + ", ".join(f"{n}: {rss[n] / 1024:.0f}" for n in samples))
    if 200 in rss and len(samples) > 2:
        last = samples[-1]
        growth = 100 * (rss[last] - rss[200]) / rss[200]
        print(f"  RSS at 200: {rss[200] / 1024:.1f} MiB, at {last}: {rss[last] / 1024:.1f} MiB, growth {growth:+.1f}%")
    return 0 if exact and code == 0 and not orphans else 1


if __name__ == "__main__":
    sys.exit(main())
