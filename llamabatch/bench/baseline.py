"""The sequential llama-cpp-python baseline `llamabatch bench --baseline` compares against.

llama-cpp-python's high-level `Llama.create_completion`, one request at a time: what a
Python user has without llamabatch. It is bench code, not engine code, so it lives apart
from the runner; the high-level `Llama` it measures comes from llama/cpu_kernels.py (only
llama/ imports llama_cpp), loaded on the engine's weight layout.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from ..params import SamplingParams, random_seed


def sequential_baseline(model_path: str, prompts: list[list[int]], max_tokens: int, *, threads: int, n_ctx: int,
                        n_batch: int, n_gpu_layers: int, params: SamplingParams,
                        on_request: Any = None, cpu_buffers: str | None = None) -> list[dict[str, Any]]:
    """`llamabatch bench --baseline`: llama-cpp-python's high-level Llama.create_completion
    over the same prompt token ids, one request at a time, with the same sampling settings.

    Returns one record per prompt: seconds (wall time of the call), prompt_tokens,
    completion_tokens, finish_reason. Model load is not timed.

    It runs on a thread of its own, which ends with it. llama.cpp's CPU backend uses
    OpenMP, whose worker team belongs to the calling thread and outlives the call: a team
    left behind on the caller's thread measurably slowed the engine thread's own team
    afterwards (8-slot decode ticks 40 ms -> 49 ms here), which would skew the comparison.
    """
    return run_in_own_thread(_sequential_baseline, model_path, prompts, max_tokens, threads=threads, n_ctx=n_ctx,
                             n_batch=n_batch, n_gpu_layers=n_gpu_layers, params=params, on_request=on_request,
                             cpu_buffers=cpu_buffers)


def run_in_own_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call fn on a fresh thread and return its result (or raise its exception)."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised on the caller's thread
            out["error"] = exc

    worker = threading.Thread(target=target, name="llamabatch-baseline")
    worker.start()
    worker.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _sequential_baseline(model_path: str, prompts: list[list[int]], max_tokens: int, *, threads: int, n_ctx: int,
                         n_batch: int, n_gpu_layers: int, params: SamplingParams,
                         on_request: Any = None, cpu_buffers: str | None = None) -> list[dict[str, Any]]:
    from ..llama.cpu_kernels import high_level_llama

    seed = params.seed if params.seed is not None else random_seed()
    # loaded on the engine's weight layout, so the baseline runs the engine's kernels
    llm = high_level_llama(model_path, cpu_buffers, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                           n_threads_batch=threads, n_gpu_layers=-1 if n_gpu_layers == -1 else n_gpu_layers,
                           seed=seed, verbose=False)
    records = []
    try:
        # Untimed warm-up, as the engine gets one: the first decode pages in the weights. Its
        # token starts no prompt, so it leaves no reusable prefix behind.
        firsts = {p[0] for p in prompts if p}
        warm = next((t for p in prompts for t in p if t not in firsts), None)
        if warm is not None:
            llm.create_completion([warm], max_tokens=1, temperature=params.temperature, seed=seed)
        for prompt in prompts:
            t0 = time.perf_counter()
            out = llm.create_completion(list(prompt), max_tokens=max_tokens, temperature=params.temperature,
                                        top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                                        typical_p=params.typical_p, repeat_penalty=params.repeat_penalty,
                                        seed=seed)
            seconds = time.perf_counter() - t0
            usage = out["usage"]
            records.append({"seconds": seconds, "prompt_tokens": usage["prompt_tokens"],
                            "completion_tokens": usage["completion_tokens"],
                            "finish_reason": out["choices"][0]["finish_reason"]})
            if on_request is not None:
                on_request(usage["completion_tokens"])
    finally:
        llm.close()
    return records
