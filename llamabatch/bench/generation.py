"""bench's generation levels: for each level B a fresh engine with n_parallel = B (twice with
--deterministic: the default engine first; twice with a KV cache type other than f16: an f16
engine first), the same prompts for every level, and
llama-cpp-python's one-request-at-a-time baseline over them.

Engines come from the caller's `open_engine(resolved)` (default: llamabatch.engines.open_engine);
progress goes to its `phase` and `advance` callbacks (generated tokens, the baseline's included).
Nothing is printed here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidRequest
from . import benchkit

OpenEngine = Callable[[Any], Any]  # resolved settings -> an open engine (EngineAPI)


def default_opener(resolved: Any) -> Any:
    """An engine as a library user gets one: llamabatch.engines.open_engine over the real factory."""
    from .. import engines  # the engine loads when one is opened: `llamabatch bench --help` never does

    return engines.open_engine(resolved)


@dataclass
class GenerationPlan:
    """What one bench run measures, checked before any model loads."""

    levels: list[int]
    counts: list[int]  # requests per level
    configs: list[Any]  # one EngineConfig per level
    params: Any  # SamplingParams: --tg tokens, ignore_eos
    pp: int
    tg: int
    prompt_lines: list[tuple[int, str]] | None  # --prompts FILE's (line number, text); None: synthetic
    baseline: bool = False
    deterministic: bool = False
    compare_kv: bool = False  # KV types other than f16/f16: each level runs with f16 first, side by side

    @property
    def smallest_slot(self) -> int:
        return min(c.slot_ctx for c in self.configs)

    def tokens_to_generate(self) -> int:
        """The progress total: every level's tokens (twice with --deterministic), then the baseline's."""
        return (sum(self.counts) * self.tg * (2 if self.deterministic or self.compare_kv else 1)
                + (max(self.counts) * self.tg if self.baseline else 0))


def plan_generation(resolved: Any, levels: list[int], pp: int, tg: int, requests: int | None,
                    prompt_lines: list[tuple[int, str]] | None, baseline: bool) -> GenerationPlan:
    """Every level's engine settings, validated; InvalidRequest when synthetic prompts of --pp
    tokens plus --tg do not fit the smallest level's slot."""
    configs = [resolved.engine.replace(n_parallel=b, max_queue=0).validate() for b in levels]
    params = resolved.sampling.replace(max_tokens=tg, ignore_eos=True).validate()
    engine = resolved.engine
    plan = GenerationPlan(levels, [requests or b for b in levels], configs, params, pp, tg, prompt_lines,
                          baseline, engine.deterministic, (engine.cache_type_k, engine.cache_type_v) != ("f16", "f16"))
    if prompt_lines is None and pp + tg > plan.smallest_slot:
        raise InvalidRequest(f"--pp {pp} + --tg {tg} = {pp + tg} tokens does not fit a slot of {plan.smallest_slot} "
                             f"(n_ctx / n_parallel); lower them or raise --n-ctx")
    return plan


@dataclass
class GenerationRun:
    figures: list[dict[str, Any]] = field(default_factory=list)
    default_figures: list[dict[str, Any]] = field(default_factory=list)  # --deterministic: without it
    f16_figures: list[dict[str, Any]] = field(default_factory=list)  # other KV types: the same levels in f16
    base: dict[str, Any] | None = None  # the baseline's figures
    model: dict[str, Any] = field(default_factory=dict)
    prompts: list[list[int]] = field(default_factory=list)  # token ids, the same for every level

    @property
    def errors(self) -> list[str]:
        return [e for level in self.figures for e in level["errors"]]


def run_generation(plan: GenerationPlan, resolved: Any, open_engine: OpenEngine = default_opener, *,
                   phase: Callable[[str], None] = lambda name: None,
                   advance: Callable[[int], None] = lambda n: None) -> GenerationRun:
    """Run every level (and the baseline when planned); `advance` is called on the engine thread."""
    run = GenerationRun()
    for b, config, count in zip(plan.levels, plan.configs, plan.counts):
        # --deterministic: the default engine first, then the deterministic one, side by side
        # other KV cache types: an f16 engine first, then the chosen types
        for variant in _variants(plan, config):
            phase(f"B={b}" + (" deterministic" if variant.deterministic else "")
                  + (f" KV {variant.cache_type_k}/{variant.cache_type_v}" if plan.compare_kv else ""))
            level = _run_level(plan, run, open_engine(dataclasses.replace(resolved, engine=variant)), count, advance)
            if variant is config:
                run.figures.append(level)
            else:
                (run.f16_figures if plan.compare_kv else run.default_figures).append(level)
    if plan.baseline:
        phase("baseline")
        first = plan.configs[0]
        run.base = benchkit.run_baseline(run.model["path"], run.prompts[:max(plan.counts)], plan.tg,
                                         threads=first.n_threads, n_batch=first.n_batch,
                                         n_gpu_layers=first.n_gpu_layers, params=resolved.sampling,
                                         on_request=advance, cpu_buffers=first.cpu_buffers)
        for level in run.figures:
            level.update(benchkit.speedup(level, run.base))
    return run


def _variants(plan: GenerationPlan, config: Any) -> list[Any]:
    """The engines one level runs on, the measured one (`config` itself) last."""
    if plan.deterministic:
        return [config.replace(deterministic=False), config]
    if plan.compare_kv:
        return [config.replace(cache_type_k="f16", cache_type_v="f16"), config]
    return [config]


def kv_figures(engine: Any) -> dict[str, Any]:
    """The level's KV cache: its types, flash attention, and MiB per slot as llama.cpp allocated
    it (the memory check's count where the runner has no log of it)."""
    from ..checks.kv_cache_types import pair_name

    config, runner = engine.config, getattr(engine, "runner", None)  # an engine in a worker has none here
    mib = runner.capabilities.kv_mib if runner is not None else None
    if mib is None:
        from ..kernel_paths.resources import needs

        mib = needs(config, runner.metadata if runner is not None else {}, 0).kv_bytes / 2**20
    return {"cache_types": pair_name(config.cache_type_k, config.cache_type_v), "flash_attn": config.flash_attn,
            "mib_per_slot": mib / config.n_parallel if mib else None}


def _run_level(plan: GenerationPlan, run: GenerationRun, engine: Any, count: int,
               advance: Callable[[int], None]) -> dict[str, Any]:
    """One level's figures on `engine` (closed after); the first engine also tokenizes the prompts."""
    try:
        if not run.prompts:
            run.model = benchkit.model_info(engine)
            run.prompts = build_prompts(engine, plan.prompt_lines, max(plan.counts), plan.pp, plan.tg,
                                        plan.smallest_slot)
        level_prompts = run.prompts[:count]
        level_pp = plan.pp if plan.prompt_lines is None else sum(map(len, level_prompts)) / len(level_prompts)
        measured = benchkit.run_level(engine, level_prompts, plan.params, on_token=advance)
        kv = kv_figures(engine)
    finally:
        engine.close()
    return {**benchkit.level_figures(measured, level_pp, plan.tg), "kv": kv}


def build_prompts(engine: Any, prompt_lines: list[tuple[int, str]] | None, count: int, pp: int, tg: int,
                  slot_ctx: int) -> list[list[int]]:
    """Token ids for `count` requests: synthetic, or the file's lines tokenized once (the same
    ids go to every level and to the baseline). InvalidRequest for a line that does not fit."""
    if prompt_lines is None:
        return benchkit.synthetic_prompts(engine.tokenize, count, pp)
    tokenized = []
    for line_no, text in prompt_lines:
        ids = engine.tokenize(text)
        if len(ids) + tg > slot_ctx:
            raise InvalidRequest(f"--prompts line {line_no}: {len(ids)} prompt tokens + --tg {tg} do not fit a "
                                 f"slot of {slot_ctx} (n_ctx / n_parallel)")
        tokenized.append(ids)
    return benchkit.cycle_prompts(tokenized, count)
