"""`n_ctx` auto: the KV cache sized from the work when the work is known (`run` reads its
file first), instead of a fixed 4,096 tokens a slot.

What a line needs is its prompt's tokens plus its `max_tokens`. The rule, over those needs:
  - every line fits 4,096 tokens: nothing changes (a stream of 4,096 cells per slot, today's
    default; it is the fastest layout on mixed prompt lengths, docs/performance.md);
  - some need more, up to the model's trained context: either one KV stream per slot, each
    as large as the longest line, or one pool shared by the slots (`kv_unified`) with room
    for the `n_parallel` largest lines at once, where one request may take up to the model's
    context and waits for room (core/scheduling/scheduler.py admits by room in a pool). Streams when
    they cost at most STREAMS_OVER_POOL times the pool's cells (a file of documents of about
    one length), else the pool (mostly short lines and a few long ones: the short ones do
    not each pay the long ones' size);
  - the KV memory allowed (half of the memory available, or what `max_memory` leaves beside
    the weights, as for `n_parallel auto`) bounds it: fewer, larger stream slots, or a
    smaller pool; a line longer than the model's context or than that memory can ever give
    is left to fail alone as its own context_overflow.
Where nothing larger is planned (no work known, or none that needs it), a slot keeps 4,096
tokens unless `max_memory` cannot hold that many for every slot beside the weights: then
each slot gets what it holds (`slot_in_memory`, the engine's own memory check asked; every
front end's engine goes through it in settings/ready.py, and the dry run reports it).
The rule is pure: the caller reads the needs (tokenizing what may be long); `model_facts`
reads the model's from its GGUF header and the machine's memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..config import DEFAULT_CTX_PER_SLOT, EngineConfig

GRAIN = 256  # cells are given in multiples of this (llama.cpp pads the KV cache to 256)
STREAMS_OVER_POOL = 1.25
DEFAULT_SLOT_REASON = f"n_ctx auto: {DEFAULT_CTX_PER_SLOT:,} tokens a slot hold every line"


@dataclass(frozen=True)
class ContextPlan:
    n_parallel: int
    n_ctx: int  # cells in all
    kv_unified: bool  # one pool shared by the slots, admission by room
    per_request: int  # the most one request may hold: a stream's cells, or the pool's cap
    too_long: int  # lines that can never fit (longer than the model's context or the memory)
    reason: str  # one sentence for the run header


def rounded(n: int) -> int:
    return -(-max(1, n) // GRAIN) * GRAIN


def request_limit(model_ctx: int | None) -> int:
    """The most one request may hold under auto: the model's trained context, never less
    than the 4,096 a slot held before auto (a model trained for less was given that)."""
    return max(model_ctx or DEFAULT_CTX_PER_SLOT, DEFAULT_CTX_PER_SLOT)


def plan_context(needs: Sequence[int], n_parallel: int, model_ctx: int | None, per_token: int | None,
                 kv_budget: int | None, budget_text: str = "the KV memory allowed", *,
                 pool_allowed: bool = True, slots_fixed: bool = False) -> ContextPlan | None:
    """The layout for lines needing `needs` tokens each (prompt + max_tokens), with
    `n_parallel` slots; None when every line fits today's 4,096-token slots (nothing changes).
    `per_token`: KV bytes a cell takes in the chosen cache types; `kv_budget`: the bytes the
    KV cache may take (None: not judged); `pool_allowed`: False in deterministic mode (its
    invariance rests on a stream per sequence); `slots_fixed`: n_parallel was given, so it is
    kept exactly (slots are then never fewer, a stream smaller where memory is short)."""
    limit = request_limit(model_ctx)
    most_cells = kv_budget // per_token if per_token and kv_budget else None
    if most_cells is not None:
        most_cells = max(GRAIN, most_cells // GRAIN * GRAIN)
    can_fit = min(limit, most_cells) if most_cells is not None else limit
    fitting = sorted((n for n in needs if n <= can_fit), reverse=True)
    too_long = len(needs) - len(fitting)
    if not fitting or fitting[0] <= DEFAULT_CTX_PER_SLOT:
        return None
    slots = n_parallel if slots_fixed else max(1, min(n_parallel, len(needs)))
    longest = rounded(fitting[0])
    streams = slots * longest
    pool = max(slots * DEFAULT_CTX_PER_SLOT, rounded(sum(fitting[:slots])))
    why_long = f"the longest line needs {fitting[0]:,} tokens (prompt + max_tokens)"
    never = (f"; {too_long} line{'' if too_long == 1 else 's'} can never fit "
             f"(over {can_fit:,} tokens)" if too_long else "")
    if kv_budget and per_token:
        never += f"; the KV cache may take {kv_budget / 2**30:.1f} GiB ({budget_text})"
    if streams <= STREAMS_OVER_POOL * pool or not pool_allowed:
        if most_cells is not None and streams > most_cells and slots_fixed:
            longest = most_cells // slots // GRAIN * GRAIN
            if longest <= DEFAULT_CTX_PER_SLOT:
                return None
            too_long = sum(1 for n in needs if n > longest)
            if not any(DEFAULT_CTX_PER_SLOT < n <= longest for n in needs):
                return None  # smaller streams would help no line
            return ContextPlan(slots, slots * longest, False, longest, too_long,
                               f"n_ctx auto: {slots} slots (--n-parallel) x {longest:,} tokens, what the memory "
                               f"allowed holds: {why_long}; {too_long} line{'' if too_long == 1 else 's'} can "
                               f"never fit")
        if most_cells is not None and streams > most_cells:
            slots = max(1, most_cells // longest)
            return ContextPlan(slots, slots * longest, False, longest, too_long,
                               f"n_ctx auto: {slots} slot{'' if slots == 1 else 's'} x {longest:,} tokens: "
                               f"{why_long}, and the memory allowed holds {slots} of that size{never}")
        return ContextPlan(slots, streams, False, longest, too_long,
                           f"n_ctx auto: {slots} slots x {longest:,} tokens: {why_long}{never}")
    if most_cells is not None and pool > most_cells:
        if most_cells < slots * DEFAULT_CTX_PER_SLOT:
            return None  # less than the default slots would hold: leave them as they were
        pool = most_cells
    return ContextPlan(slots, pool, True, min(limit, pool), too_long,
                       f"n_ctx auto: {slots} slots share a pool of {pool:,} tokens (kv_unified), one request up "
                       f"to {min(limit, pool):,}, each admitted when there is room: {why_long}, most lines far "
                       f"fewer{never}")


def model_facts(config: EngineConfig, model_path: str) -> tuple[int | None, int | None, int | None, str]:
    """(the model's trained context, KV bytes a cell takes in config's cache types, the KV
    bytes allowed, what allows them) from the GGUF header and this machine's memory: the KV
    cache may take half of the memory available, and no more than max_memory leaves beside
    the weights (as for n_parallel auto, autoslots.bounds)."""
    from ..llama.autoslots import KV_MEMORY_SHARE
    from ..models.gguf_header import GGUFError, read_header
    from ..kernel_paths.resources import available_memory, kv_bytes_per_token, weights_size
    from ..checks.max_memory import DEFAULT_MAX_MEMORY, memory_cap

    try:
        header = read_header(model_path)
    except (GGUFError, OSError):
        return None, None, None, ""
    per_token = kv_bytes_per_token(header.metadata, config.cache_type_k, config.cache_type_v)
    memory = available_memory()
    if memory is None:
        return header.context_length, per_token, None, ""
    budget, text = int(memory * KV_MEMORY_SHARE), f"half of the {memory / 2**30:.1f} GiB available"
    # the engine's own check (resources.check) allows the KV and the weights together max_memory
    # (default 90% of what is available): never plan past what it would refuse
    cap = memory_cap(config.max_memory if config.max_memory is not None else DEFAULT_MAX_MEMORY, memory)
    if cap is not None and cap - weights_size(model_path) < budget:
        budget = max(0, cap - weights_size(model_path))
        text = f"max_memory {config.max_memory or DEFAULT_MAX_MEMORY} less the weights"
    return header.context_length, per_token, budget, text


def slot_in_memory(config: EngineConfig, model_path: str, *, memory: int | None = None) -> tuple[int, str] | None:
    """n_ctx auto where no plan sized the context: the tokens each of config's n_parallel
    slots gets when slots of a default 4,096 would take more than the engine's memory check
    allows (max_memory, by default 90% of what is available, less the weights:
    llama/resources.check, asked as it will be asked at load), the most it allows in whole
    GRAINs, and why in a few words. None when nothing changes: n_ctx given, n_parallel not a
    count yet, layers on a GPU (not checked), the model's header unreadable, the memory not
    known, the default fits, or not even GRAIN tokens a slot fit (the check refuses in its own
    words then)."""
    from ..models.gguf_header import GGUFError, read_header
    from ..kernel_paths.resources import available_memory, check, weights_size
    from ..checks.max_memory import DEFAULT_MAX_MEMORY
    from ..errors import LlamaBatchError, ResourceLimit

    if config.n_ctx is not None or config.n_parallel == "auto" or config.n_gpu_layers != 0:
        return None
    try:
        metadata = read_header(model_path).metadata
    except (GGUFError, OSError):
        return None
    memory = memory if memory is not None else available_memory()
    if memory is None:
        return None
    slots = int(config.n_parallel)

    def fits(tokens: int) -> bool:
        try:
            check(config.replace(n_ctx=tokens * slots), model_path, metadata=metadata, memory=memory)
        except ResourceLimit:
            return False
        except LlamaBatchError:
            return True  # refused for another reason (a cache type the model cannot take): said at load
        return True

    if fits(DEFAULT_CTX_PER_SLOT):
        return None
    tokens = next((t for t in range(DEFAULT_CTX_PER_SLOT - GRAIN, 0, -GRAIN) if fits(t)), None)
    if tokens is None:
        return None
    limit = config.max_memory if config.max_memory is not None else DEFAULT_MAX_MEMORY
    return tokens, (f"n_ctx auto: {tokens:,} tokens a slot, what max_memory {limit} holds for "
                    f"{slots} slot{'' if slots == 1 else 's'} beside {weights_size(model_path) / 2**20:.1f} MiB "
                    "of weights")
