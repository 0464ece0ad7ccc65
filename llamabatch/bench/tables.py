"""Rich tables for `llamabatch bench`: turn benchkit's figures into what people read."""
from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table

BATCHED_COLUMNS = ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s")
LATENCY_COLUMNS = ("B", "Metric", "Mean ms", "Median ms", "P99 ms")
THROUGHPUT_COLUMNS = ("B", "Requests", "Failed", "Duration s", "Request/s", "Output tok/s", "Total tok/s")
TICK_COLUMNS = ("Tick", "Batch", "Decode", "Prefill", "Active", "Queue", "Eval ms", "Sample ms", "Overhead ms")
BASELINE_COLUMNS = ("Requests", "Prompt tokens", "Generated", "Time s", "Request/s", "Output tok/s", "Total tok/s")
SPEEDUP_COLUMN = "Speedup"
DETERMINISTIC_COLUMNS = ("B", "Default tok/s", "Deterministic tok/s", "Ratio")
KV_COLUMNS = ("B", "f16 tok/s", "tok/s", "Ratio", "f16 KV MiB/slot", "KV MiB/slot", "KV ratio")
TRACE_COLUMNS = ("Ticks", "Count", "Wall share", "Tokens", "Decode", "Prefill", "Guessed", "Kept", "Preempted",
                 "Graph runs", "Eval ms",
                 "Eval ms/token", "Sample ms", "Plan ms", "Fill ms", "After ms", "Wall ms")


def _table(title: str, columns: Sequence[str], first_left: int = 0) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < first_left else "right", no_wrap=True)
    return table


def _pp(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def batched_table(levels: Sequence[dict[str, Any]], with_speedup: bool) -> Table:
    columns = BATCHED_COLUMNS + ((SPEEDUP_COLUMN,) if with_speedup else ())
    table = _table("Throughput (llama-batched-bench columns)", columns)
    for level in levels:
        b = level["batched"]
        row = [_pp(b["pp"]), str(b["tg"]), str(b["pl"]), str(b["n_kv"]),
               f"{b['t_pp']:.3f}", f"{b['speed_pp']:.2f}", f"{b['t_tg']:.3f}", f"{b['speed_tg']:.2f}",
               f"{b['t']:.3f}", f"{b['speed']:.2f}"]
        if with_speedup:
            row.append(f"{level['speedup']:.2f}x")
        table.add_row(*row)
    return table


def latency_table(levels: Sequence[dict[str, Any]]) -> Table:
    table = _table("Request latency (vLLM names)", LATENCY_COLUMNS, first_left=2)
    for n, level in enumerate(levels):
        lat = level["latency"]
        for i, (metric, key) in enumerate((("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el"))):
            table.add_row(str(level["n_parallel"]) if i == 0 else "", metric,
                          f"{lat[f'mean_{key}_ms']:.2f}", f"{lat[f'median_{key}_ms']:.2f}",
                          f"{lat[f'p99_{key}_ms']:.2f}", end_section=(i == 3 and n < len(levels) - 1))
    return table


def throughput_table(levels: Sequence[dict[str, Any]]) -> Table:
    table = _table("Request throughput", THROUGHPUT_COLUMNS)
    for level in levels:
        lat = level["latency"]
        table.add_row(str(level["n_parallel"]), str(lat["completed"] + lat["failed"]), str(lat["failed"]),
                      f"{lat['duration']:.3f}", f"{lat['request_throughput']:.2f}",
                      f"{lat['output_throughput']:.2f}", f"{lat['total_token_throughput']:.2f}")
    return table


def ticks_table(level: dict[str, Any], last: int) -> Table:
    """The level's ticks (the last `last` of them when last > 0) and a row of means over all."""
    ticks = level["ticks"]
    shown = ticks[-last:] if last > 0 else ticks
    what = f"last {len(shown)} of {len(ticks)}" if len(shown) < len(ticks) else f"all {len(ticks)}"
    table = _table(f"Ticks, B={level['n_parallel']} ({what})", TICK_COLUMNS)
    for t in shown:
        table.add_row(str(t["tick"]), str(t["batch_size"]), str(t["decode_tokens"]), str(t["prefill_tokens"]),
                      str(t["active_slots"]), str(t["queue_depth"]), f"{t['eval_ms']:.2f}",
                      f"{t['sample_ms']:.2f}", f"{t['overhead_ms']:.2f}",
                      end_section=t is shown[-1])
    s = level["tick_summary"]
    table.add_row(f"mean of {s['ticks']}", f"{s['mean_batch_size']:.1f}", f"{s['mean_decode_tokens']:.1f}",
                  f"{s['mean_prefill_tokens']:.1f}", f"{s['mean_active_slots']:.1f}",
                  f"{s['mean_queue_depth']:.1f}", f"{s['mean_eval_ms']:.2f}", f"{s['mean_sample_ms']:.2f}",
                  f"{s['mean_overhead_ms']:.2f}", style="bold")
    return table


def tick_summary_line(level: dict[str, Any], n_batch: int) -> str:
    s = level["tick_summary"]
    return (f"B={level['n_parallel']}: mean batch fill {s['slot_fill']:.0%} of the slots "
            f"({s['mean_active_slots']:.1f} of {level['n_parallel']}), {s['token_fill']:.1%} of the "
            f"n_batch budget ({s['mean_batch_size']:.1f} of {n_batch} tokens); "
            f"{s['mixed_share']:.0%} of ticks mixed prefill with decode; "
            f"Python overhead {s['overhead_share']:.1%} of tick time")


def baseline_table(baseline: dict[str, Any]) -> Table:
    table = _table("Sequential baseline (llama-cpp-python Llama.create_completion, one request at a time)",
                   BASELINE_COLUMNS)
    table.add_row(str(baseline["requests"]), str(baseline["prompt_tokens"]), str(baseline["generated_tokens"]),
                  f"{baseline['seconds']:.3f}", f"{baseline['request_throughput']:.2f}",
                  f"{baseline['output_throughput']:.2f}", f"{baseline['total_token_throughput']:.2f}")
    return table


def deterministic_table(default: Sequence[dict[str, Any]], deterministic: Sequence[dict[str, Any]]) -> Table:
    """bench --deterministic: output tokens per second of both modes per level, and their ratio."""
    table = _table("Cost of --deterministic (output tokens per second)", DETERMINISTIC_COLUMNS)
    for a, b in zip(default, deterministic):
        da, db = a["latency"]["output_throughput"], b["latency"]["output_throughput"]
        table.add_row(str(a["n_parallel"]), f"{da:.2f}", f"{db:.2f}", f"{db / da:.2f}" if da else "-")
    return table


def kv_types_table(f16: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]) -> Table:
    """bench with KV types other than f16: output tokens per second and KV MiB per slot of
    both caches per level, and their ratios."""
    types = (other[0].get("kv") or {}).get("cache_types", "?") if other else "?"
    table = _table(f"KV cache {types} against f16/f16 (output tokens per second, KV per slot)", KV_COLUMNS)
    for a, b in zip(f16, other):
        ta, tb = a["latency"]["output_throughput"], b["latency"]["output_throughput"]
        ka, kb = (a.get("kv") or {}).get("mib_per_slot"), (b.get("kv") or {}).get("mib_per_slot")
        table.add_row(str(a["n_parallel"]), f"{ta:.2f}", f"{tb:.2f}", f"{tb / ta:.2f}" if ta else "-",
                      f"{ka:.2f}" if ka else "-", f"{kb:.2f}" if kb else "-", f"{kb / ka:.3f}" if ka and kb else "-")
    return table


def trace_table(level: dict[str, Any]) -> Table:
    """bench --verbose: the level's ticks by kind, means per tick (trace.py)."""
    table = _table(f"Trace, B={level['n_parallel']}: mean per tick, by kind", TRACE_COLUMNS, first_left=1)
    for kind, r in level["trace"].items():
        table.add_row(kind, str(r["ticks"]), f"{r['share_of_wall']:.0%}", f"{r['mean_tokens']:.1f}",
                      f"{r['mean_decode_tokens']:.1f}", f"{r['mean_prefill_tokens']:.1f}",
                      f"{r.get('mean_drafted_tokens', 0.0):.1f}", f"{r.get('mean_accepted_tokens', 0.0):.1f}",
                      str(int(r.get("preemptions", 0))), f"{r['mean_ubatches']:.2f}",
                      f"{r['mean_eval_ms']:.2f}", f"{r['eval_ms_per_token']:.3f}", f"{r['mean_sample_ms']:.2f}",
                      f"{r['mean_plan_ms']:.2f}", f"{r['mean_fill_ms']:.2f}", f"{r['mean_after_ms']:.2f}",
                      f"{r['mean_wall_ms']:.2f}", style="bold" if kind == "all" else None)
    return table
