"""The document `bench --json` writes: every figure of a run with the machine, the model, the
versions and the settings it ran with (report.py reads one back)."""
from __future__ import annotations

import datetime
import json
from typing import Any

from .. import __version__
from ..errors import ReportFileError
from . import benchkit
from .generation import GenerationPlan, GenerationRun


def _header(model: dict[str, Any], threads: int) -> dict[str, Any]:
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "llamabatch_version": __version__,
        "llama_cpp_python_version": benchkit.package_version("llama-cpp-python"),
        "machine": benchkit.machine_info(),
        "model": model,
        "threads": threads,
    }


def generation_document(plan: GenerationPlan, run: GenerationRun, sampling: Any, requests: int | None,
                        prompts: str | None) -> dict[str, Any]:
    """`requests`, `prompts`: --requests and --prompts as given. With --deterministic, "levels"
    are the deterministic runs and "default_levels" the same levels without it."""
    config, s = plan.configs[0], sampling
    document = _header(run.model, config.n_threads)
    document.update({
        "settings": {
            "parallel": plan.levels, "pp": plan.pp if prompts is None else None, "tg": plan.tg,
            "requests": requests, "requests_per_level": plan.counts, "prompts_file": prompts,
            "policy": config.policy, "n_batch": config.n_batch, "chunk_size": config.chunk_size,
            "cache_prompt": config.cache_prompt, "n_ctx": config.n_ctx, "n_gpu_layers": config.n_gpu_layers,
            "threads": config.n_threads, "deterministic": config.deterministic,
            "cache_type_k": config.cache_type_k, "cache_type_v": config.cache_type_v, "flash_attn": config.flash_attn,
            "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                         "repeat_penalty": s.repeat_penalty, "seed": s.seed, "ignore_eos": True},
            "warm_up": benchkit.WARM_UP_NOTE,
            "t_pp_t_tg": "each tick's wall time split by its prefill and decode token counts",
        },
        "levels": run.figures,
        "baseline": run.base,
    })
    if plan.deterministic:
        document["default_levels"] = run.default_figures
    if plan.compare_kv:  # the same levels with an f16 cache, measured just before each
        document["f16_levels"] = run.f16_figures
    return document


def embed_document(figures: list[dict[str, Any]], model: dict[str, Any], threads: int, batches: list[int],
                   count: int, pp: int, prompts: str | None) -> dict[str, Any]:
    document = _header(model, threads)
    document.update({
        "settings": {"embed_batches": batches, "inputs": count, "pp": pp if prompts is None else None,
                     "prompts_file": prompts},
        "embed_levels": figures,
    })
    return document


def write_json(path: str, document: dict[str, Any]) -> None:
    """--json FILE; ReportFileError (one line naming it) when it cannot be written."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    except OSError as exc:
        raise ReportFileError(f"--json {path}: {exc.strerror or exc}") from None
