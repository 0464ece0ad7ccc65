"""Resources checked before they are taken: memory for the KV cache and weights, and threads.

llama.cpp allocates the whole KV cache when a context is created. Asked for more than the
machine has (`--n-ctx 1000000000`), it does not fail: the process grows until the kernel
kills it or the machine swaps. A thread count far above the CPUs (`--threads 100000`)
ends in std::bad_alloc inside the thread pool. Both are settings, not request data, so
they are refused before anything is allocated, with one line naming the setting and the
figure (ResourceLimit, an InvalidRequest: exit 2 in the CLI).

What is counted, mirroring the runner's choices (load.py's context parameters):
- KV cache: every layer's keys and values for every cell, in the configured cache types
  (cache_type_k/cache_type_v; kv_cache_types.py has ggml's bytes per block). Cells: n_ctx (padded as
  llama.cpp pads it); in deterministic mode slot_ctx x the sequence ids it uses, spares
  included (batch_invariance.n_sequence_ids, counted with the widest row rule since the
  kernels are only known once the weights have loaded). A sliding-window layer (Gemma 3:
  5 of every 6) counts at full size too: the runner always keeps the full-size window cache.
- Weights: the GGUF's size on disk (all shards); llama.cpp maps or reads all of it.
Compared with the memory available now (MemAvailable) and `max_memory` (default 90% of it).
Layers offloaded to a GPU (n_gpu_layers != 0) put weights and KV in GPU memory, which is
not known here: the memory check is skipped then, and llama.cpp's own allocation stands.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..checks.cpus import usable_cpus
from ..config import EngineConfig
from ..errors import InvalidRequest, ResourceLimit
from ..checks.kv_cache_types import BLOCKS, CACHE_TYPES, fits_rows, row_bytes
from ..checks.max_memory import DEFAULT_MAX_MEMORY, memory_cap

THREADS_PER_CPU = 4  # more threads than this per CPU is a typo, not a tuning choice
CTX_PAD = 256  # llama.cpp rounds a context up to a multiple of this

@dataclass(frozen=True)
class Needs:
    """What a context with these settings will allocate, in bytes, and why."""

    sequences: int  # KV streams: the slots, plus deterministic mode's spares
    cells: int  # KV cells of a full-size layer, all sequences together
    kv_bytes: int
    weights: int
    per_token: int | None  # bytes of one cell over every layer (None: the model does not say)

    @property
    def total(self) -> int:
        return self.kv_bytes + self.weights


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def kv_bytes_per_token(metadata: Mapping[str, str], cache_type_k: str = "f16", cache_type_v: str = "f16") -> int | None:
    """KV cache bytes one token needs in one slot (keys and values of every layer in the given
    types, as ggml_row_size counts them), from GGUF metadata; None when the model does not say."""
    dims = kv_dims(metadata)
    if dims is None:
        return None
    layers, heads_kv, k_len, v_len = dims
    try:
        return layers * (row_bytes(cache_type_k, heads_kv * k_len) + row_bytes(cache_type_v, heads_kv * v_len))
    except ValueError:  # a head size the type cannot split (cache_type_problem says so first)
        return None


def kv_dims(metadata: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    """(layers, KV heads, key length, value length) from GGUF metadata, or None."""
    arch = metadata.get("general.architecture")
    try:
        layers = int(metadata[f"{arch}.block_count"])
        heads_kv = int(metadata.get(f"{arch}.attention.head_count_kv") or metadata[f"{arch}.attention.head_count"])
        embd = int(metadata[f"{arch}.embedding_length"])
        heads = int(metadata[f"{arch}.attention.head_count"])
        k_len = int(metadata.get(f"{arch}.attention.key_length") or embd // heads)
        v_len = int(metadata.get(f"{arch}.attention.value_length") or embd // heads)
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return layers, heads_kv, k_len, v_len


def cache_type_problem(config: EngineConfig, metadata: Mapping[str, Any]) -> str | None:
    """One line when this model's attention heads cannot be stored in the configured cache
    types (a block type needs a head size that is a multiple of its block), else None."""
    dims = kv_dims(metadata)
    if dims is None:
        return None
    _layers, _heads, k_len, v_len = dims
    for key, head in (("cache_type_k", k_len), ("cache_type_v", v_len)):
        name = getattr(config, key)
        if not fits_rows(name, head):
            usable = ", ".join(t for t in CACHE_TYPES if fits_rows(t, head))
            return (f"{key} {name} cannot hold this model's attention heads of {head} values "
                    f"(blocks of {BLOCKS[name][0]}); this model takes: {usable}")
    return None


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (Linux MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def kv_layer_bytes(metadata: Mapping[str, Any], cache_type_k: str = "f16",
                   cache_type_v: str = "f16") -> tuple[int, int] | None:
    """(layers, bytes one cell of one layer takes), or None when the metadata does not say."""
    per_token = kv_bytes_per_token(metadata, cache_type_k, cache_type_v)
    arch = metadata.get("general.architecture")
    try:
        layers = int(metadata[f"{arch}.block_count"])
    except (KeyError, TypeError, ValueError):
        return None
    return (layers, per_token // layers) if per_token and layers > 0 else None


def needs(config: EngineConfig, metadata: Mapping[str, Any], weights: int, shapes: Any = None) -> Needs:
    """The KV cache and weights `config` (n_parallel an integer) will take for this model.
    `shapes`: deterministic mode's row rule when known (else the widest, an upper bound)."""
    from . import batch_invariance as invariance

    slots = int(config.n_parallel)
    sequences, cells = slots, _pad(config.total_ctx)
    if config.deterministic:  # load.py: slot_ctx cells for each sequence id, spares included
        shapes = shapes or invariance.Shapes(invariance.REPACK_GEMM_TILE, invariance.TILED_MIN_BATCH)
        sequences = invariance.n_sequence_ids(slots, shapes)
        cells = _pad(config.slot_ctx * sequences)
    layer = kv_layer_bytes(metadata, config.cache_type_k, config.cache_type_v)
    if layer is None:
        return Needs(sequences, cells, 0, weights, None)
    layers, per_layer = layer
    kv = per_layer * layers * cells  # window layers too: load.py keeps their cache full-size
    return Needs(sequences, cells, kv, weights, per_layer * layers)


def weights_size(model_path: str) -> int:
    """Bytes of the GGUF and, for a split model, every shard after it."""
    from ..models.gguf_shards import shard_info, shards_of
    from pathlib import Path

    files = shards_of(Path(model_path)) if shard_info(model_path) else (model_path,)
    total = 0
    for f in files:
        try:
            total += os.path.getsize(f)
        except OSError:
            pass
    return total


def check_threads(config: EngineConfig, cpus: int | None = None) -> None:
    cpus = cpus or usable_cpus()
    if config.threads is not None and config.threads > THREADS_PER_CPU * cpus:
        raise ResourceLimit(
            f"threads {config.threads} is more than {THREADS_PER_CPU} per CPU this process may use ({cpus} CPUs, so at "
            f"most {THREADS_PER_CPU * cpus}); llama.cpp starts every one of them: use --threads {cpus} or fewer")


def threads_beyond_cpus(config: EngineConfig, cpus: int | None = None) -> str | None:
    """The notice for an explicit thread count above the CPUs this process may use, None when
    it fits. Such a count runs as given (check_threads refuses only the absurd): llama.cpp's
    threads wait for each other at every graph node, so a thread with no CPU of its own holds
    the others up, the more so beside other work."""
    cpus = cpus or usable_cpus()
    if config.threads is None or config.threads <= cpus:
        return None
    return (f"warning: threads {config.threads} is more than the {cpus} CPU(s) this process may use; "
            f"llama.cpp's threads then wait for each other: leave --threads unset to use {cpus}")


def check(config: EngineConfig, model_path: str, *, metadata: Mapping[str, Any] | None = None,
          memory: int | None = None, cpus: int | None = None, shapes: Any = None) -> Needs | None:
    """Raise ResourceLimit (one line) when `config` asks for more threads or memory than this
    machine allows; return what it needs (None when the memory could not be judged).
    `metadata` defaults to the GGUF header, `memory` to what the OS says is available."""
    check_threads(config, cpus)
    quantized = (config.cache_type_k, config.cache_type_v) != ("f16", "f16")
    if (config.n_parallel == "auto" or config.n_gpu_layers != 0) and not quantized:
        return None  # auto: checked again once resolved; GPU layers: see the module docstring
    if metadata is None:
        from ..models.gguf_header import GGUFError, read_header

        try:
            metadata = read_header(model_path).metadata
        except (OSError, GGUFError):
            return None  # loading reports an unreadable model in its own words
    problem = cache_type_problem(config, metadata)
    if problem:
        raise InvalidRequest(problem)
    if config.n_parallel == "auto" or config.n_gpu_layers != 0:
        return None
    need = needs(config, metadata, weights_size(model_path), shapes)
    if memory is None:
        memory = available_memory()
    if memory is None:
        return need
    cap = memory_cap(config.max_memory, memory)
    if cap is not None and need.total > cap:
        raise ResourceLimit(_too_much(config, need, memory, cap))
    return need


def check_addition(config: EngineConfig, need: int, taken: int, what: str, *, memory: int | None = None) -> None:
    """Raise ResourceLimit when `need` more bytes, allocated after the engine's own `taken`
    (the embedding context, made on first use), do not fit: under a size for max_memory, in
    what that size leaves; under a share, in that share of what is available now (the engine's
    allocations are already out of it); never more than is available."""
    if config.n_gpu_layers != 0:
        return  # see the module docstring
    if memory is None:
        memory = available_memory()
    if memory is None:
        return
    cap = memory_cap(config.max_memory, memory)
    if cap is None:
        return
    limit = config.max_memory if config.max_memory is not None else DEFAULT_MAX_MEMORY
    sized = isinstance(limit, int) or "%" not in limit
    allowed = min(max(cap - taken, 0), memory) if sized else cap
    if need > allowed:
        named = _size(limit) if isinstance(limit, int) else limit
        leaves = (f"the {_size(allowed)} max_memory {named} leaves beside the engine's {_size(taken)}" if sized
                  else f"the {_size(allowed)} max_memory {named} allows of the {_size(memory)} available now")
        raise ResourceLimit(f"{what} needs {_size(need)}, more than {leaves}: raise max_memory or lower n_batch")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def _too_much(config: EngineConfig, need: Needs, memory: int, cap: int) -> str:
    limit = config.max_memory if config.max_memory is not None else DEFAULT_MAX_MEMORY
    allowed = f"the {_size(cap)} allowed (max_memory {limit}; {_size(memory)} available now)"
    if need.weights > cap:  # no slot setting can help
        return (f"the model's weights alone need {_size(need.weights)}, more than {allowed}: "
                f"use a smaller model or raise max_memory")
    slots = int(config.n_parallel)
    setting = f"n_ctx {config.n_ctx}" if config.n_ctx else f"n_parallel {slots} (4096 tokens per slot)"
    spares = need.sequences - slots
    seqs = f"{slots} slots" + (f" + {spares} deterministic-mode spare sequences" if spares > 0 else "")
    types = f" in {config.cache_type_k}/{config.cache_type_v}"
    shape = (f"{seqs} x {need.cells // max(1, need.sequences):,} tokens x {_size(need.per_token)} per token{types}"
             if need.per_token else "")
    # n_ctx auto already gave each slot what max_memory holds (context_sizing.slot_in_memory), down
    # to 256 tokens: at one slot nothing but more memory or a smaller cache is left to lower
    lower = "n_ctx" if config.n_ctx else ("n_parallel" if slots > 1 else None)
    fixes = [f"lower {lower}"] if lower else ["raise max_memory"]
    if config.cache_type_v == "f16":
        fixes.append("use --cache-type-k q8_0 --cache-type-v q8_0")
    return (f"{setting} needs {_size(need.kv_bytes)} of KV cache ({shape}) plus {_size(need.weights)} of weights, "
            f"more than {allowed}: {' or '.join(fixes)}")
