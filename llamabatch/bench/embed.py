"""`llamabatch bench --embed`: embeddings throughput (inputs/s, tokens/s) at several batch
sizes, a batch size being the most tokens one embedding llama_decode takes (n_batch).

Each level gets a fresh engine with that n_batch, embeds one warm-up input (the embedding
context is made on first use, not timed), then receives every input at once, one request
each (as `run` submits a file of lines), and is timed from the first submit to the last
result. Inputs are --pp tokens, distinct, or the lines of --prompts.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

from rich.table import Table

from ..errors import InvalidRequest
from ..results import EmbeddingResult
from . import benchkit
from .generation import default_opener

EMBED_COLUMNS = ("Batch", "Inputs", "Failed", "Tokens", "Decodes", "Inputs/decode", "Time s", "Inputs/s", "Tok/s")
DEFAULT_BATCHES = "64,128,256,512"
DEFAULT_INPUTS = 256


def parse_batches(text: str) -> list[int]:
    """--embed-batch's sizes; InvalidRequest (one line) for anything but integers >= 1."""
    try:
        return benchkit.parse_levels(text)
    except InvalidRequest:
        raise InvalidRequest(f"--embed-batch must be a comma-separated list of integers >= 1, got {text!r}") from None


def plan_configs(resolved: Any, batches: Sequence[int]) -> list[Any]:
    """One engine config per batch size: one slot (no generation runs), n_batch = the size."""
    return [resolved.engine.replace(n_parallel=1, n_batch=b, n_ctx=max(b, 256), max_queue=0).validate()
            for b in batches]


def run_levels(resolved: Any, configs: Sequence[Any], count: int, pp: int,
               prompt_lines: list[tuple[int, str]] | None, open_engine: Callable[[Any], Any] = default_opener, *,
               phase: Callable[[str], None] = lambda name: None,
               advance: Callable[[int], None] = lambda n: None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every batch size's figures (one engine each, the same inputs for each) and the model's info.
    InvalidRequest when a batch size is below the longest input. `open_engine(resolved)`
    defaults to llamabatch.engines.open_engine."""
    figures: list[dict[str, Any]] = []
    model: dict[str, Any] = {}
    inputs: list[list[int]] = []
    for config in configs:
        phase(f"batch {config.n_batch}")
        engine = open_engine(dataclasses.replace(resolved, engine=config))
        try:
            if not inputs:
                model = benchkit.model_info(engine)
                inputs = (benchkit.synthetic_prompts(engine.tokenize, count, pp) if prompt_lines is None else
                          benchkit.cycle_prompts([engine.tokenize(t) for _, t in prompt_lines], count))
                check_batches([c.n_batch for c in configs], inputs)
            figures.append(run_level(engine, inputs, on_input=advance))
        finally:
            engine.close()
    return figures, model


def check_batches(levels: Sequence[int], inputs: Sequence[list[int]]) -> None:
    longest = max(len(t) for t in inputs)
    too_small = [b for b in levels if b < longest]
    if too_small:
        raise InvalidRequest(f"--embed: batch size {too_small[0]} is below the longest input ({longest} tokens); "
                             "every input must fit one llama_decode")


def run_level(engine: Any, inputs: Sequence[list[int]], on_input: Any = None) -> dict[str, Any]:
    """Embed every input (one request each, all at once) on `engine`; the level's figures."""
    engine.embed(inputs[0])  # warm-up: makes the embedding context
    decodes = [0]
    counted = threading.Lock()

    def on_record(record: Any) -> None:
        if getattr(record, "kind", "") == "tick" and record.decode_tokens == 0 and record.prefill_tokens:
            with counted:
                decodes[0] += 1

    unsubscribe = engine.subscribe(on_record)

    def finished(_handle: Any, item: Any) -> None:
        if isinstance(item, EmbeddingResult) and on_input is not None:
            on_input(1)

    t0 = time.perf_counter()
    try:
        with engine.hold():  # every input waits together: the first decode is as full as later ones
            handles = [engine.submit_embedding(list(tokens), callback=finished) for tokens in inputs]
        results = [h.result() for h in handles]
        wall = time.perf_counter() - t0
    finally:
        unsubscribe()
    failed = [r for r in results if not r.ok]
    tokens = sum(len(t) for t in inputs)
    return {
        "n_batch": engine.config.n_batch, "inputs": len(inputs), "failed": len(failed),
        "errors": [r.error or r.finish_reason for r in failed], "tokens": tokens, "decodes": decodes[0],
        "inputs_per_decode": len(inputs) / decodes[0] if decodes[0] else 0.0, "time_s": wall,
        "inputs_per_s": len(inputs) / wall if wall > 0 else 0.0, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "pooling": results[0].pooling if results else "",
    }


def embed_table(levels: Sequence[dict[str, Any]], threads: int) -> Table:
    table = Table(title=f"Embeddings throughput ({threads} threads; batch = tokens per llama_decode)",
                  title_justify="left", header_style="bold")
    for name in EMBED_COLUMNS:
        table.add_column(name, justify="right", no_wrap=True)
    for lv in levels:
        table.add_row(str(lv["n_batch"]), str(lv["inputs"]), str(lv["failed"]), str(lv["tokens"]),
                      str(lv["decodes"]), f"{lv['inputs_per_decode']:.1f}", f"{lv['time_s']:.2f}",
                      f"{lv['inputs_per_s']:.1f}", f"{lv['tokens_per_s']:.1f}")
    return table
