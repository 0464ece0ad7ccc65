"""`llamabatch run --dry-run` for people: the estimate (llamabatch.jobs.estimate_job) as lines."""
from __future__ import annotations

import json
from typing import Any

from .progress import clock_duration


def estimate_lines(r: dict[str, Any]) -> list[str]:
    p = r["prompt_tokens"]
    lines = [f"llamabatch run --dry-run: {r['input']}",
             f"  lines          {r['lines']} ({r['to_run']} to run: {r['valid']} valid, {r['invalid']} invalid)"]
    if r.get("resume"):
        s = r["resume"]
        lines.append(f"  resume         {s['already_answered']} already answered, {s['retried']} to retry"
                     + (", a retry merge is pending (the next --resume finishes it)"
                        if s.get("pending_retry_merge") else ""))
        if s["not_in_input"]:
            lines.append(f"  not in INPUT   {s['not_in_input']} record(s) in OUTPUT answer no INPUT line: "
                         + ", ".join(json.dumps(i) for i in s["not_in_input_ids"])
                         + (", ..." if s["not_in_input"] > len(s["not_in_input_ids"]) else ""))
    for code, n in r["invalid_by_code"].items():
        lines.append(f"  invalid        {n} {code}")
    for e in r["first_errors"]:
        lines.append(f"    {e}")
    lines.append(f"  prompt tokens  {p['total']} total, max {p['max']}, p50 {p['p50']}, p95 {p['p95']}")
    lines.append(f"  prefix reuse   ~{r['prefix_reuse_tokens']} prompt tokens served from the cache (estimate)")
    lines.append(f"  output tokens  at most {r['max_output_tokens']} (max_tokens of every line)")
    s = r["slots"]
    if s.get("kv_unified") and s.get("n_ctx"):
        lines.append(f"  slots          {s['n_parallel'] if s['n_parallel'] else '?'} sharing {s['n_ctx']} tokens, "
                     f"one request up to {s['slot_ctx'] if s['slot_ctx'] else '?'} ({s['source']})")
    else:
        lines.append(f"  slots          {s['n_parallel'] if s['n_parallel'] else '?'} x "
                     f"{s['slot_ctx'] if s['slot_ctx'] else '?'} tokens ({s['source']})")
    if s.get("context_reason"):
        lines.append(f"  context        {s['context_reason']}")
    e = r["eta"]
    if e["low_s"] is None:
        lines.append(f"  ETA            unknown: {e['basis']}")
    else:
        lines.append(f"  ETA            {clock_duration(e['low_s'])} to {clock_duration(e['high_s'])} ({e['basis']})")
    return lines
