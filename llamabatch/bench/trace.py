"""A level's ticks broken down by kind (bench --verbose; JSON key "trace").

Ticks are grouped as llama.cpp sees them: decode rows only, prefill rows only, or both in one
batch (mixed). For each group: how many, mean tokens and graph runs (ubatches: llama.cpp
splits a batch into ubatches of at most n_ubatch rows, and with a KV stream per slot only
consecutive slots share one; see kernel_paths/ubatch_split.py), and where the mean tick's wall time
went: llama_decode, the C samplers, and the Python work before (cancels, admission,
scheduling), while filling the llama_batch, and after (stops, detokenizing, delivery,
telemetry). What is left (wall minus all of these) is loop bookkeeping between them. With
speculative decoding, the guesses a tick verified (part of its decode rows) and those kept;
with priorities, the requests preempted (put aside for higher-priority ones).
"""
from __future__ import annotations

from typing import Any, Sequence

KINDS = ("decode", "mixed", "prefill", "all")
TIMES = ("eval_ms", "sample_ms", "plan_ms", "fill_ms", "after_ms", "wall_ms")


def tick_kind(tick: dict[str, Any]) -> str:
    if tick["prefill_tokens"] and tick["decode_tokens"]:
        return "mixed"
    return "prefill" if tick["prefill_tokens"] else "decode"


def trace_figures(ticks: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """kind -> {ticks, share_of_wall, mean tokens/decode/prefill/ubatches, mean of each time};
    a kind with no ticks is left out."""
    total_wall = sum(t["wall_ms"] for t in ticks)
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        group = [t for t in ticks if kind == "all" or tick_kind(t) == kind]
        if not group:
            continue
        n = len(group)
        row: dict[str, float] = {
            "ticks": n,
            "share_of_wall": sum(t["wall_ms"] for t in group) / total_wall if total_wall else 0.0,
            "mean_tokens": sum(t["batch_size"] for t in group) / n,
            "mean_decode_tokens": sum(t["decode_tokens"] for t in group) / n,
            "mean_prefill_tokens": sum(t["prefill_tokens"] for t in group) / n,
            "mean_ubatches": sum(t.get("ubatches", 0) for t in group) / n,
            # speculative decoding: guesses verified per tick, and those kept (docs/speculative.md)
            "mean_drafted_tokens": sum(t.get("drafted_tokens", 0) for t in group) / n,
            "mean_accepted_tokens": sum(t.get("accepted_tokens", 0) for t in group) / n,
            # priority: requests put aside for higher-priority ones before these ticks (a count)
            "preemptions": sum(t.get("preemptions", 0) for t in group),
        }
        for name in TIMES:
            row[f"mean_{name}"] = sum(t.get(name, 0.0) for t in group) / n
        row["eval_ms_per_token"] = row["mean_eval_ms"] / row["mean_tokens"] if row["mean_tokens"] else 0.0
        out[kind] = row
    return out
