"""`n_parallel="auto"`: pick the slot count by measuring decode speed on this machine.

The best slot count depends on the CPU's matmul kernels (llama.cpp's repacked weights go
through a 4-row gemm tile, so B = 5 can be slower than B = 4) and differs from machine to
machine. A short calibration runs a few decode ticks at each candidate count (multiples of
the 4-row tile), keeps the curve in the XDG cache dir keyed by model file, threads and
machine, and reuses it next time. The choice is bounded by the memory the KV cache needs
per slot and, when the caller knows it (`run` with an input file), by the number of
requests: more slots than lines can never be busy.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from ..config import DEFAULT_CTX_PER_SLOT, EngineConfig
from ..checks.kv_cache_types import pair_name
from ..checks.max_memory import memory_cap
from ..files.replaced_file import replacing
# the KV and memory figures are resources.py's (which also checks them before a context is made)
from ..kernel_paths.resources import available_memory, kv_bytes_per_token, weights_size

log = logging.getLogger("llamabatch.autoslots")

CANDIDATES = (4, 8, 16, 24, 32)  # multiples of the CPU kernels' 4-row tile, ~2-3 s to measure all
REFERENCE = 8  # a fixed count to compare the choice against in the header line ("1.40x over 8")
NEAR_BEST = 0.95  # the smallest count within 5% of the best wins: fewer slots, less memory
KV_MEMORY_SHARE = 0.5  # at most this share of available memory goes to the KV cache
CALIBRATION_CTX = 64  # tokens per slot while calibrating: a short prompt and a few decode steps
BUSY = 1.0  # 1-minute load average per core from which a calibration's timings are disturbed


@dataclass
class Choice:
    n_parallel: int
    reason: str  # why, for the header line: "auto: 1.40x over 8 here" ("" for an explicit count)
    measured: dict[int, float]  # slot count -> decode tokens/s, as measured or read from the cache
    from_cache: bool = False


def slot_ctx_for(config: EngineConfig, n: int) -> int:
    return config.n_ctx // n if config.n_ctx else DEFAULT_CTX_PER_SLOT


def bounds(config: EngineConfig, per_token: int | None, memory: int | None, max_slots: int | None,
           weights: int = 0) -> tuple[int, str]:
    """The most slots allowed, and what set that bound ("" when only CANDIDATES did).
    `per_token`: KV bytes of one token in the configured cache types; the KV may take half of
    `memory`, and never more than max_memory leaves beside the `weights` (resources.check
    would refuse the count otherwise)."""
    limit, why = max(CANDIDATES), ""
    if config.n_ctx:  # a fixed total context: each slot keeps at least 256 tokens
        by_ctx = max(1, config.n_ctx // 256)
        if by_ctx < limit:
            limit, why = by_ctx, f"n_ctx {config.n_ctx}: at least 256 tokens per slot"
    if per_token and memory:
        per_slot = per_token * slot_ctx_for(config, limit)
        budget, of = memory * KV_MEMORY_SHARE, f"half of {memory / 2**30:.1f} GiB available"
        cap = memory_cap(config.max_memory, memory) if config.max_memory is not None else None
        if cap is not None and cap - weights < budget:
            budget, of = max(0, cap - weights), f"max_memory {config.max_memory} less the weights"
        by_memory = max(1, int(budget // per_slot))
        if by_memory < limit:
            types = pair_name(config.cache_type_k, config.cache_type_v)
            limit, why = by_memory, f"KV memory: {per_slot / 2**20:.0f} MiB per slot in {types}, {of}"
    if max_slots is not None and max_slots < limit:
        limit, why = max(1, max_slots), f"{max_slots} input line{'' if max_slots == 1 else 's'}"
    return limit, why


def pick(measured: Mapping[int, float], limit: int) -> int:
    """The smallest slot count within NEAR_BEST of the best measured one, at most `limit`."""
    usable = {n: v for n, v in measured.items() if n <= limit and v > 0}
    if not usable:
        return min(limit, REFERENCE)
    best = max(usable.values())
    return min(n for n, v in usable.items() if v >= NEAR_BEST * best)


def describe(n: int, measured: Mapping[int, float], bound_why: str, limit: int) -> str:
    """Why `n` slots, for the header line: "auto: 1.40x over 8 here"."""
    if bound_why and n == limit:
        return f"auto: bounded by {bound_why}"
    ref = measured.get(REFERENCE)
    if n != REFERENCE and ref and measured.get(n):
        return f"auto: {measured[n] / ref:.2f}x over {REFERENCE} here"
    return "auto: the fastest measured here"


# -- the cache ------------------------------------------------------------------------------

def load_per_core() -> float | None:
    """The 1-minute load average per core (None where the OS keeps none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def timed_when_busy(entry: dict, load_now: float | None) -> bool:
    """Whether a cached curve was timed on a busy machine and this one is quiet now: then it is
    measured again, since a curve timed beside other work would pick slots for that work. A
    curve from a busy machine is still used while the machine stays busy (measuring again
    would be as disturbed), and one with no load recorded is kept as it is."""
    then = entry.get("load")
    return isinstance(then, (int, float)) and then >= BUSY and load_now is not None and load_now < BUSY / 2


def cache_path() -> Path:
    """slots.json in llamabatch's cache folder ($LLAMABATCH_CACHE_DIR, else the XDG cache dir)."""
    from ..files.cache_folder import cache_dir

    return cache_dir() / "slots.json"


def machine_key() -> str:
    from ..kernel_paths.machine_verdicts import cpu_name

    return f"{cpu_name()} x{os.cpu_count()}"


def cache_key(model_path: str, threads: int, cpu_buffers: str | None = None, kv: str = "") -> str:
    """`kv`: kv_setting(config): the cache types and flash attention change the decode curve
    and the bytes per token recorded with it."""
    try:
        st = os.stat(model_path)
        model = f"{os.path.basename(model_path)}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        model = os.path.basename(model_path)
    # the weight layout decides the kernels, and so the curve (cpu_buffers.py); "auto" keeps
    # the key it had before the setting existed
    layout = "" if cpu_buffers in (None, "auto") else f"|cpu_buffers={cpu_buffers}"
    return f"{model}|threads={threads}{layout}{kv}|{machine_key()}"


def kv_setting(config: EngineConfig) -> str:
    """The cache key's part for the KV types, flash attention and layout; "" for the defaults,
    which keeps the key calibrations had before these settings existed. The layout decides how
    llama.cpp splits a tick (kernel_paths/ubatch_split.py), and so the curve: `serve`, which shares one
    cache by default, does not reuse a curve measured on a stream per slot."""
    types = pair_name(config.cache_type_k, config.cache_type_v)
    layout = "|kv_unified" if config.kv_unified else ""
    if types == "f16/f16" and config.flash_attn == "auto":
        return layout
    return f"|kv={types}|flash_attn={config.flash_attn}{layout}"


def read_cache(key: str) -> dict | None:
    try:
        entry = json.loads(cache_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("measured"), dict):
        return None
    try:
        entry["measured"] = {int(k): float(v) for k, v in entry["measured"].items()}
    except (TypeError, ValueError):
        return None
    return entry


def write_cache(key: str, entry: dict) -> None:
    """Best effort: a cache that cannot be written only means measuring again next time."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[key] = {**entry, "measured": {str(k): v for k, v in entry["measured"].items()}}
        # a name of this process's own: Ray workers on one node may write at the same moment
        with replacing(path) as tmp:
            Path(tmp).write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError as exc:
        log.debug("could not write %s: %s", path, exc)


# -- choosing ---------------------------------------------------------------------------------

Measure = Callable[[list[int]], tuple[dict[int, float], int | None]]
"""Measure(levels) -> ({level: decode tok/s}, KV bytes per token or None)."""


def choose(config: EngineConfig, model_path: str, *, max_slots: int | None = None,
           measure: Measure | None = None, memory: int | None = None,
           load_now: Callable[[], float | None] | None = None) -> Choice:
    """Resolve n_parallel="auto" for `config` (an explicit integer is returned unchanged).

    `max_slots` bounds the count (e.g. the number of input lines); `measure` defaults to a
    calibration on the real model (`calibrate`); `memory` to what the OS says is available;
    `load_now` to `load_per_core` (recorded with a curve, see `timed_when_busy`).
    """
    if config.n_parallel != "auto":
        return Choice(int(config.n_parallel), "", {})
    if max_slots is not None and max_slots <= 1:
        return Choice(1, "auto: bounded by 1 input line", {})
    memory = available_memory() if memory is None else memory
    measure = measure or (lambda levels: calibrate(config, model_path, levels))
    from ..kernel_paths.cpu_buffers import chosen

    key = cache_key(model_path, config.n_threads, chosen(config.cpu_buffers), kv_setting(config))
    load = (load_now or load_per_core)()
    entry = read_cache(key)
    if entry is not None and timed_when_busy(entry, load):
        entry = None
    from_cache = entry is not None
    per_token = entry.get("kv_bytes_per_token") if entry else None
    weights = weights_size(model_path)
    limit, why = bounds(config, per_token, memory, max_slots, weights)
    levels = sorted({c for c in CANDIDATES if c <= limit} | ({limit} if limit < max(CANDIDATES) else set()))
    measured = dict(entry["measured"]) if entry else {}
    missing = [n for n in levels if n not in measured]
    if len(levels) > 1 and missing:
        t0 = time.perf_counter()
        got, per_token_now = measure(missing)
        measured.update(got)
        from_cache = False
        log.info("calibrated slot counts %s in %.1fs: %s", missing, time.perf_counter() - t0, got)
        if per_token_now:
            per_token = per_token_now
            limit, why = bounds(config, per_token, memory, max_slots, weights)
            if limit not in measured and limit > 1:  # the memory bound, known only now: measure it too
                measured.update(measure([limit])[0])
        stamp = {"at": int(time.time())} if load is None else {"at": int(time.time()), "load": round(load, 2)}
        write_cache(key, {"measured": measured, "kv_bytes_per_token": per_token, **stamp})
    n = pick(measured, limit)
    return Choice(n, describe(n, measured, why, limit), measured, from_cache)


def resolve(config: EngineConfig, model_path: str, **kwargs) -> tuple[EngineConfig, Choice]:
    """`config` with n_parallel an integer, and the Choice that says why."""
    choice = choose(config, model_path, **kwargs)
    return config.replace(n_parallel=choice.n_parallel), choice


def calibrate(config: EngineConfig, model_path: str, levels: list[int], ticks: int = 3) -> tuple[dict[int, float], int | None]:
    """Decode tokens/s at each slot count in `levels`, on the real model: every slot gets a
    short distinct prompt, then one untimed and `ticks` timed decode ticks of one token per
    slot. One context sized for the largest level serves every level."""
    from ..params import SamplingParams
    from ..core.plan import Chunk, StepPlan, Trim
    from .runner import LlamaRunner  # only llama/ imports llama_cpp

    top = max(levels)
    runner = LlamaRunner(config.replace(n_parallel=top, n_ctx=top * CALIBRATION_CTX, n_batch=max(512, top * 8),
                                        cache_prompt=False), model_path)
    samplers = []
    try:
        words = runner.tokenize(" ".join(f"item {i} costs {i * 7 % 13} coins" for i in range(top * 2)), special=False)
        for _ in range(top):
            samplers.append(runner.build_sampler(SamplingParams(temperature=0, ignore_eos=True), 0))
        out: dict[int, float] = {}
        for b in sorted(levels):
            prompts = [words[:1] + words[1 + 3 * s:1 + 3 * s + 7] for s in range(b)]
            plan = StepPlan([Chunk(s, s, p, 0, True, False, sampler=samplers[s]) for s, p in enumerate(prompts)],
                            trims=[Trim(slot, 0) for slot in range(top)])  # the last level's KV goes first
            result = runner.execute(plan)
            pos = [len(p) for p in prompts]
            elapsed = 0.0
            for tick in range(ticks + 1):
                chunks = [Chunk(s, s, [result.sampled[s]], pos[s], True, True, sampler=samplers[s]) for s in range(b)]
                t0 = time.perf_counter()
                result = runner.execute(StepPlan(chunks))
                if tick:  # the first tick after a prefill is not timed
                    elapsed += time.perf_counter() - t0
                if result.status != 0:
                    raise RuntimeError(f"calibration decode failed with status {result.status}")
                pos = [p + 1 for p in pos]
            out[b] = b * ticks / elapsed if elapsed > 0 else 0.0
        return out, kv_bytes_per_token(runner.metadata, config.cache_type_k, config.cache_type_v)
    finally:
        for sampler in samplers:
            runner.free_sampler(sampler)
        runner.close()
