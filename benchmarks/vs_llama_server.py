"""llamabatch's engine against llama.cpp's own llama-server, side by side in one process run.

Builds (once, cached) llama-server and llama-batched-bench from the llama.cpp sources inside
llama-cpp-python's sdist with ../shared/tools/build-llama-cpp-tools.sh, then runs three
workloads, greedy with ignore_eos (every request generates exactly its token count), the
same token-id prompts for both sides:

  (a) uniform:  32 prompts x 64 tokens out
  (b) shared:   64 lines sharing one ~700-token labelling instruction with examples, short
                items, 16 tokens out
  (c) mixed:    24 prompts of 10..1,500 tokens (seeded), 32 tokens out

Each workload runs every system twice, in alternating order (A B A B ...):
  server-tuned   llama-server -np N --swa-full (as a user would tune it, equal slots)
  engine         the llamabatch Engine with N slots
  server-default llama-server with nothing but the model, threads and the KV cache flags
  engine-auto    the Engine with n_parallel="auto" (when this build has it)
All requests are sent at once (the server gets one HTTP client per request); model load and
server start-up are not timed; each run has one untimed warm-up request. Figures are
generated tokens per second of wall clock; ratios are per pair (run i of one system over
run i of the other), since others may share the CPU.

--kv-layouts streams,unified runs the engine once per KV layout (a stream per slot, the
default; or one cache for every slot), each its own row; --trace prints, per workload, the
engine's ticks by kind (bench --verbose's trace: graph runs per tick, where the time went)
beside the tuned server's own counters from /metrics (llama_decode calls, prompt and
generation seconds).

Last, decode speed: llama-batched-bench S_TG (pp 32, tg 64) against the engine's S_TG from
the same workload through `llamabatch bench`'s code (benchkit), at each B of --batched.

It measures and prints; it never asserts on time. Usage:

  python benchmarks/vs_llama_server.py [--slots 8] [--threads 2] [--workloads a,b,c]
      [--repeat 2] [--batched 1,4,8,16] [--bin DIR] [--model PATH] [--no-defaults] [--defaults-for a,b,c]
      [--kv-layouts streams,unified] [--cache-type-k f16] [--cache-type-v f16] [--flash-attn auto] [--trace]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from _bench import kernels, machine_line, model_path, say, server_completion, sky_prompts, timed_generate, workload_args
from _tool_crash import crash_line

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.bench.trace import trace_figures
from llamabatch.checks.kv_cache_types import CACHE_TYPES, FLASH_ATTN
from llamabatch.kernel_paths.cpu_buffers import chosen
from llamabatch.llama.cpu_kernels import cpu_extra_buffer_types

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / ".." / "shared" / "tools" / "build-llama-cpp-tools.sh"
SLOT_CTX = 2048  # per slot, both sides: the longest mixed prompt (1,500) plus its answer fits


CPU_BUFFERS: str | None = None  # --cpu-buffers: the weight layout both sides run (None: auto)
# --cache-type-k/-v and --flash-attn: the KV cache both sides run (EngineConfig's names and values)
KV: dict[str, str] = {"cache_type_k": "f16", "cache_type_v": "f16", "flash_attn": "auto"}


def server_kv_args() -> list[str]:
    """The same KV cache for llama-server, by its own flags."""
    return ["-ctk", KV["cache_type_k"], "-ctv", KV["cache_type_v"], "-fa", KV["flash_attn"]]


def engine_kernels(model: str):
    return kernels(model, CPU_BUFFERS)


def same_kernels(model: str) -> list[str]:
    """llama.cpp flags that put the C++ tools on the engine's kernels (cpu_buffers.py): plain
    weights are --no-repack; llama.cpp's default layout is no flag; CPU_REPACK alone is the
    default where the build has no other extra buffer type (no AMX, no KleidiAI)."""
    path = engine_kernels(model)
    if not path.use_extra_bufts and not path.pin_repack:
        return ["--no-repack"]
    if path.pin_repack and set(cpu_extra_buffer_types()) != {"CPU_REPACK"}:
        others = ", ".join(cpu_extra_buffer_types())
        if chosen(CPU_BUFFERS) == "auto":  # AMX built in but not running here: the tools' default would use it
            raise SystemExit(f"{path.why}; llama.cpp's tools cannot be told to use CPU_REPACK alone (this build has "
                             f"{others}): rerun with --cpu-buffers plain, which starts them with --no-repack")
        raise SystemExit(f"--cpu-buffers repack: this build also has {others}; the C++ "
                         f"tools cannot be told to use CPU_REPACK alone here")
    return []


def tool_died(tool: str, returncode: int | None, detail: str) -> SystemExit:
    """The one line a benchmark ends with when llama.cpp's own `tool` failed: a crash signal
    (SIGILL where the CPU lists AMX and traps it) says what to rerun with."""
    return SystemExit(crash_line(tool, returncode, chosen(CPU_BUFFERS))
                      or f"llama.cpp's own {tool} exited with {returncode}: {detail}")


# -- workloads ------------------------------------------------------------------------------

@dataclass
class Workload:
    key: str
    title: str
    prompts: list[list[int]]
    max_tokens: int
    notes: str = ""


REVIEWS = [
    ("The battery lasts two full days and the screen is sharp.", "POSITIVE"),
    ("Stopped charging after a week; support never answered.", "NEGATIVE"),
    ("Great sound, but the ear cushions hurt after an hour.", "MIXED"),
    ("Arrived broken and the replacement was broken too.", "NEGATIVE"),
    ("Does exactly what it says, quietly and quickly.", "POSITIVE"),
    ("Cheap plastic, yet it has survived three drops.", "MIXED"),
    ("The app crashes every time I open the settings.", "NEGATIVE"),
    ("Setup took two minutes and it has worked ever since.", "POSITIVE"),
    ("Beautiful design, terrible instructions.", "MIXED"),
    ("Refund took a month and three phone calls.", "NEGATIVE"),
]


def labelling_instruction() -> str:
    """~700 tokens: the rules, then worked examples (as a user's few-shot prompt would be)."""
    rules = ("You are a careful labelling assistant for an online shop. Read one customer review and "
             "answer with exactly one label: POSITIVE when the customer is satisfied overall, NEGATIVE "
             "when the customer is dissatisfied overall, MIXED when the review clearly praises one thing "
             "and criticises another. Ignore spelling mistakes, shipping jokes and star ratings. Do not "
             "explain the label. Do not repeat the review. Answer in upper case.\n\n")
    examples = "".join(f"Review {i + 1}: {text}\nLabel: {label}\n\n"
                       for i, (text, label) in enumerate(REVIEWS * 3))
    return rules + "Examples:\n\n" + examples


ITEMS = ["Fast delivery, but the box was crushed.", "I love it and bought a second one.",
         "It broke on the first day.", "Works fine, nothing special.", "Too loud to use at night.",
         "The colour is lovely and it fits well.", "Missing parts and no reply from the seller.",
         "Good value for the price, slow app though."]


def workloads(tokenize, which: str) -> list[Workload]:
    out = []
    if "a" in which:
        prompts = [tokenize(text) for text in sky_prompts(32)]
        out.append(Workload("a", "uniform, 32 prompts x 64 tokens", prompts, 64))
    if "b" in which:
        instruction = labelling_instruction()
        prompts = [tokenize(f"{instruction}Review {31 + i}: {ITEMS[i % len(ITEMS)]} (order {1000 + i})\nLabel:")
                   for i in range(64)]
        shared = os.path.commonprefix(prompts)
        out.append(Workload("b", "shared instruction, 64 lines x 16 tokens", prompts, 16,
                            f"instruction {len(tokenize(instruction))} tokens, {len(shared)} shared by every line"))
    if "c" in which:
        rng = random.Random(11)
        pool = tokenize(" ".join(f"Record {i}: the sensor in room {i % 17} read {i * 37 % 101} degrees at "
                                 f"{i % 24:02d}:00 and the door was {'open' if i % 3 else 'closed'}."
                                 for i in range(400)))[1:]
        lengths = sorted(rng.randint(10, 1500) for _ in range(24))
        rng.shuffle(lengths)
        prompts = []
        for j, n in enumerate(lengths):
            start = (j * 613) % (len(pool) - 1600)  # distinct starts: no shared prefixes
            prompts.append(tokenize("")[:1] + pool[start:start + n - 1])
        out.append(Workload("c", "mixed prompt lengths, 24 prompts x 32 tokens", prompts, 32,
                            f"prompt lengths {min(lengths)}..{max(lengths)} tokens, {sum(lengths)} in all"))
    return out


# -- llama-server ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: str, model: str, threads: int, extra: list[str]):
        self.port = free_port()
        self.args = [binary, "-m", model, "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1",
                     "--port", str(self.port), *same_kernels(model), *extra]
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "Server":
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise tool_died("llama-server", self.proc.returncode, " ".join(self.args))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if json.load(r).get("status") == "ok":
                        return self
            except Exception:
                time.sleep(0.3)
        raise RuntimeError("llama-server did not become healthy in 180 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def complete(self, prompt: list[int], n: int) -> int:
        return server_completion(self.port, prompt, n, ignore_eos=True)["tokens_predicted"]

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (started with --metrics), by name without prefix."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except Exception:
            return {}
        out = {}
        for line in text.splitlines():
            m = re.fullmatch(r"llamacpp:(\w+) ([-+\d.eE]+)", line.strip())
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def props(self) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/props", timeout=5) as r:
                return json.load(r)
        except Exception:
            return {}


def run_server(binary: str, model: str, threads: int, extra: list[str], w: Workload,
               trace: list | None = None) -> tuple[float, str]:
    with Server(binary, model, threads, [*extra, "--metrics"]) as server:
        server.complete(w.prompts[0][:1] + [w.prompts[0][-1]], 2)  # untimed warm-up
        slots = server.props().get("total_slots", "?")
        before = server.metrics()
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(len(w.prompts)) as pool:
            generated = sum(pool.map(lambda p: server.complete(p, w.max_tokens), w.prompts))
        seconds = time.perf_counter() - t0
        after = server.metrics()
    if trace is not None:
        trace.append({k: after.get(k, 0.0) - before.get(k, 0.0) for k in after} | {"wall_s": seconds})
    return generated / seconds, f"{slots} slots"


# -- the engine -----------------------------------------------------------------------------

def run_engine(model: str, threads: int, slots, w: Workload, unified: bool = False,
               trace: list | None = None, prefix_store: str | None = None) -> tuple[float, str]:
    """`prefix_store`: the engine's disk prefix store folder (None: off, the library's default);
    benchmarks/prefix_store.py runs workload (b) twice on one."""
    n = slots if isinstance(slots, int) else None
    config = EngineConfig(model=model, n_parallel=slots, n_ctx=SLOT_CTX * n if n else None, threads=threads,
                          cpu_buffers=CPU_BUFFERS, kv_unified=unified, prefix_store=prefix_store, **KV)
    params = SamplingParams(temperature=0, max_tokens=w.max_tokens, ignore_eos=True)
    with Engine(config) as engine:
        engine.generate([w.prompts[0][:1] + [w.prompts[0][-1]]], params.replace(max_tokens=2))  # untimed warm-up
        run = timed_generate(engine, w.prompts, params)
        cached = sum(r.usage.cached_tokens for r in run.results)
        restored = sum(r.usage.restored_tokens for r in run.results)
        note = f"{engine.config.n_parallel} slots, {cached} prompt tokens copied or cached"
        if prefix_store is not None:
            note += f" ({restored} of them restored from the disk prefix store)"
            if engine.disk is not None:
                engine.disk.store.flush(60)  # the next run must find what this one saved
    if trace is not None:
        trace.append(trace_figures([t.to_dict() for t in run.ticks]) | {"wall_s": run.seconds})
    if run.failed:
        raise RuntimeError(f"engine: {len(run.failed)} requests failed, first: {run.failed[0].error}")
    return run.tok_s, note


# -- llama-batched-bench ----------------------------------------------------------------------

def batched_bench(binary: str, model: str, threads: int, levels: list[int]) -> dict[int, float]:
    ctx = max(levels) * 128
    proc = subprocess.run([binary, "-m", model, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", "32",
                           "-ntg", "64", "-npl", ",".join(map(str, levels)), "-t", str(threads), "-tb", str(threads),
                           *same_kernels(model), *server_kv_args()],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise tool_died("llama-batched-bench", proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1][:200])
    out = proc.stdout
    s_tg = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and all(re.fullmatch(r"[\d.]+", c) for c in cells[:8]):
            s_tg[int(cells[2])] = float(cells[7])  # PP TG B N_KV T_PP S_PP T_TG S_TG ...
    return s_tg


def engine_s_tg(model: str, threads: int, b: int, unified: bool = False) -> float:
    from llamabatch.bench import benchkit

    config = EngineConfig(model=model, n_parallel=b, n_ctx=128 * b, threads=threads, cpu_buffers=CPU_BUFFERS,
                          kv_unified=unified, **KV)
    with Engine(config) as engine:
        prompts = benchkit.synthetic_prompts(engine.tokenize, b, 32)
        run = benchkit.run_level(engine, prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    return benchkit.batched_figures(run, 32, 64)["speed_tg"]


# -- the table ---------------------------------------------------------------------------------

@dataclass
class Row:
    system: str
    runs: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def ratios(a: Row, b: Row) -> str:
    return ", ".join(f"{x / y:.2f}" for x, y in zip(a.runs, b.runs) if y > 0)


def print_trace(w: Workload, traces: dict[str, list]) -> None:
    """The engine's ticks by kind (means over the workload's runs) and the server's counters."""
    print(f"### ({w.key}) trace: the engine's ticks by kind, mean per tick over {w.key}'s runs\n")
    print("| engine | ticks | count | wall share | tokens | decode | prefill | graph runs | eval ms | "
          "eval ms/token | sample ms | Python before + fill + after ms | wall ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for system, runs in traces.items():
        if not system.startswith("engine") or not runs:
            continue
        for kind in ("decode", "mixed", "prefill", "all"):
            rows = [r[kind] for r in runs if kind in r]
            if not rows:
                continue
            mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
            print(f"| {system} | {kind} | {mean['ticks']:.0f} | {mean['share_of_wall']:.0%} | "
                  f"{mean['mean_tokens']:.1f} | {mean['mean_decode_tokens']:.1f} | {mean['mean_prefill_tokens']:.1f} | "
                  f"{mean['mean_ubatches']:.2f} | {mean['mean_eval_ms']:.1f} | {mean['eval_ms_per_token']:.3f} | "
                  f"{mean['mean_sample_ms']:.2f} | "
                  f"{mean['mean_plan_ms'] + mean['mean_fill_ms'] + mean['mean_after_ms']:.2f} | "
                  f"{mean['mean_wall_ms']:.1f} |")
    server = traces.get("server-tuned") or []
    if server:
        mean = {k: sum(r.get(k, 0.0) for r in server) / len(server) for k in server[0]}
        calls = mean.get("n_decode_total", 0.0)
        print(f"\nserver-tuned, mean per run: {calls:.0f} llama_decode calls; prompt "
              f"{mean.get('prompt_tokens_total', 0):.0f} tokens in {mean.get('prompt_seconds_total', 0):.1f} s, "
              f"generation {mean.get('tokens_predicted_total', 0):.0f} tokens in "
              f"{mean.get('tokens_predicted_seconds_total', 0):.1f} s, wall {mean['wall_s']:.1f} s")
        for system, runs in traces.items():
            if system.startswith("engine") and runs:
                ticks = sum(r["all"]["ticks"] for r in runs if "all" in r) / len(runs)
                print(f"{system}, mean per run: {ticks:.0f} llama_decode calls, wall "
                      f"{sum(r['wall_s'] for r in runs) / len(runs):.1f} s")
    print(flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, slots=8, threads=2, model=True, cpu_buffers=True)
    ap.add_argument("--workloads", default="a,b,c")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--batched", default="1,4,8,16", help="B levels for the S_TG comparison ('' = skip)")
    ap.add_argument("--bin", help="folder with llama-server and llama-batched-bench [default: build them]")
    ap.add_argument("--no-defaults", action="store_true", help="skip llama-server on its defaults and engine auto")
    ap.add_argument("--defaults-for", default="a,b,c",
                    help="workloads that also run llama-server on its defaults and engine auto [default: all]")
    ap.add_argument("--kv-layouts", default="streams",
                    help="engine KV layouts to run, comma-separated: streams (a stream per slot), unified")
    ap.add_argument("--cache-type-k", "-ctk", default="f16", choices=CACHE_TYPES, help="KV cache K type, both sides")
    ap.add_argument("--cache-type-v", "-ctv", default="f16", choices=CACHE_TYPES, help="KV cache V type, both sides")
    ap.add_argument("--flash-attn", "-fa", default="auto", choices=FLASH_ATTN, help="flash attention, both sides")
    ap.add_argument("--trace", action="store_true",
                    help="per workload, the engine's ticks by kind beside the tuned server's /metrics counters")
    args = ap.parse_args()
    args.layouts = [x.strip() for x in args.kv_layouts.split(",") if x.strip()]
    if not args.layouts or set(args.layouts) - {"streams", "unified"}:
        ap.error("--kv-layouts takes streams and/or unified")
    return args


def compared_systems(args: argparse.Namespace, model: str, server_bin: str,
                     traces: dict[str, list]) -> list[tuple[str, Callable]]:
    """(name, run one workload) per system: the tuned server, the engine per KV layout, then
    (unless --no-defaults) the server on its defaults and the engine on auto."""
    n = args.slots
    systems = [("server-tuned", lambda w: run_server(server_bin, model, args.threads,
                                                     ["-np", str(n), "-c", str(SLOT_CTX * n), "--swa-full",
                                                      *server_kv_args()], w,
                                                     traces.setdefault("server-tuned", [])))]
    for layout in args.layouts:
        name = f"engine {n} slots" + (f" {layout}" if len(args.layouts) > 1 else "")
        systems.append((name, lambda w, name=name, unified=layout == "unified": run_engine(
            model, args.threads, n, w, unified, traces.setdefault(name, []))))
    if not args.no_defaults:
        systems.append(("server-default", lambda w: run_server(server_bin, model, args.threads, server_kv_args(), w)))
        systems.append(("engine auto", lambda w: run_engine(model, args.threads, "auto", w)))
    return systems


def compare_workload(w: Any, systems: list[tuple[str, Callable]], args: argparse.Namespace,
                     traces: dict[str, list]) -> None:
    """--repeat runs of every system on workload `w`, then its table and the ratios per pair."""
    n_engines = len(args.layouts)
    say(f"== ({w.key}) {w.title} {w.notes}")
    these = systems if w.key in args.defaults_for else systems[:1 + n_engines]
    rows = [Row(name) for name, _ in these]
    traces.clear()
    for rep in range(args.repeat):
        for row, (name, fn) in zip(rows, these):
            tok_s, note = fn(w)
            row.runs.append(tok_s)
            row.notes.append(note)
            say(f"   run {rep + 1} {name}: {tok_s:.1f} tok/s ({note})")
    print(f"## ({w.key}) {w.title}" + (f" ({w.notes})" if w.notes else "") + "\n")
    print("| system | tok/s per run | notes |\n|---|---|---|")
    for row in rows:
        print(f"| {row.system} | {fmt(row.runs)} | {row.notes[0]} |")
    print()
    for engine_row in rows[1:1 + n_engines]:
        print(f"- {engine_row.system} / server-tuned, per pair: {ratios(engine_row, rows[0])}")
    if len(rows) > 1 + n_engines:
        default, auto = rows[1 + n_engines], rows[2 + n_engines]
        print(f"- {rows[1].system} / server-default, per pair: {ratios(rows[1], default)}")
        print(f"- engine auto / server-default, per pair: {ratios(auto, default)}")
    print(flush=True)
    if args.trace:
        print_trace(w, traces)


def compare_decode_speed(args: argparse.Namespace, model: str, bin_dir: str, levels: list[int]) -> None:
    """S_TG at each B: llama-batched-bench against the engine, per KV layout."""
    say("== decode speed: llama-batched-bench vs the engine (pp 32, tg 64)")
    print("## decode speed, S_TG t/s (pp 32, tg 64)\n")
    print("| B | KV layout | llama-batched-bench | engine | engine / batched-bench |\n|---|---|---|---|---|")
    ref_runs: list[dict[int, float]] = []
    eng_runs: dict[str, list[dict[int, float]]] = {layout: [] for layout in args.layouts}
    for rep in range(args.repeat):
        ref_runs.append(batched_bench(str(Path(bin_dir) / "llama-batched-bench"), model, args.threads, levels))
        for layout in args.layouts:
            eng_runs[layout].append({b: engine_s_tg(model, args.threads, b, layout == "unified") for b in levels})
        say(f"   run {rep + 1}: batched-bench {ref_runs[-1]}, engine {[e[-1] for e in eng_runs.values()]}")
    for b in levels:
        refs = [r.get(b, 0.0) for r in ref_runs]
        for layout in args.layouts:
            engs = [e[b] for e in eng_runs[layout]]
            print(f"| {b} | {layout} | {fmt(refs)} | {fmt(engs)} | "
                  f"{', '.join(f'{e / r:.2f}' for e, r in zip(engs, refs) if r)} |")
    print()


def main() -> int:
    args = parse_args()
    global CPU_BUFFERS
    CPU_BUFFERS = args.cpu_buffers
    KV.update(cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v, flash_attn=args.flash_attn)

    model = model_path(args.model)
    bin_dir = args.bin or subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                                         check=True).stdout.strip().splitlines()[-1]
    with Engine(EngineConfig(model=model, n_parallel=1, n_ctx=2048, threads=args.threads)) as probe:
        tokenize = probe.tokenize
        loads = workloads(lambda text: tokenize(text), args.workloads)
    order = [k.strip() for k in args.workloads.split(",")]
    loads.sort(key=lambda w: order.index(w.key))  # in the order asked: the most wanted first
    traces: dict[str, list] = {}  # system -> one trace per run of the current workload
    systems = compared_systems(args, model, str(Path(bin_dir) / "llama-server"), traces)

    print(f"# llamabatch vs llama-server: {Path(model).name}, {args.threads} threads, greedy, ignore_eos, "
          f"{machine_line(model, CPU_BUFFERS)}; server flags: {' '.join(same_kernels(model)) or 'none'} "
          f"(figures are noisy: compare ratios per pair)\n")
    for w in loads:
        compare_workload(w, systems, args, traces)
    levels = [int(x) for x in args.batched.split(",") if x.strip()]
    if levels:
        compare_decode_speed(args, model, bin_dir, levels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
