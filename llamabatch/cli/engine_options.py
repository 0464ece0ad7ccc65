"""The engine and sampling options every engine-running command takes (run, serve-stdin,
serve, chat, bench, config show), declared once as Typer flags.

Each defaults to None ("not given on the command line") so settings can be
layered: flags > LLAMABATCH_* environment > config file > built-in defaults. The layering
itself is the settings layer's (llamabatch/settings/): a command hands `opts` to
`engine_setup.resolve_options`, which returns the one Resolved value it runs with.
"""
from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Optional

import typer

from ..core.scheduling.policies import POLICIES
from ..checks.kv_cache_types import CACHE_TYPES
from ..settings.layers import SHARED_KEYS
from .env import Environment

ENGINE = "Engine"
SAMPLING = "Sampling"


def _opt(*decls: str, help: str, panel: str, **kw: Any) -> Any:
    # "[default: x]" would be read as rich markup and vanish: escape the bracket
    return typer.Option(*decls, help=help.replace("[", "\\["), rich_help_panel=panel, show_default=False, **kw)


# name -> (annotation, where the value goes). Keys are the config-file / env spelling.
ENGINE_OPTIONS: dict[str, Any] = {
    "model": Annotated[Optional[str], _opt("--model", "-m", help="GGUF file or folder[:QUANT], hf:ORG/REPO[:QUANT], ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO[:QUANT] or a [models] alias (`llamabatch models` lists them); gemma = the bundled Gemma 3 270M base, smollm2 = SmolLM2-135M-Instruct [default: run, serve-stdin, chat: smollm2 when installed, else gemma; bench: gemma]", panel=ENGINE)],
    "n_parallel": Annotated[Optional[str], _opt("--n-parallel", metavar="N|auto", help="Slots: sequences decoded together; auto = measure the fastest count on this machine (cached) [default: auto; chat: 1]", panel=ENGINE)],
    "n_ctx": Annotated[Optional[str], _opt("--n-ctx", metavar="N|auto", help="Total KV context in tokens, split evenly between slots; auto = run sizes it from INPUT's longest lines (larger slots, or a pool the slots share), else 4096 per slot [default: auto]", panel=ENGINE)],
    "n_batch": Annotated[Optional[int], _opt("--n-batch", help="Most tokens in one forward pass [default: 512]", panel=ENGINE)],
    "chunk_size": Annotated[Optional[int], _opt("--chunk-size", help="Most prompt tokens per slot per tick [default: 256]", panel=ENGINE)],
    "threads": Annotated[Optional[int], _opt("--threads", "-t", help="CPU threads [default: the cores this process may use (taskset, cpuset, CPU quota), at most 8]", panel=ENGINE)],
    "policy": Annotated[Optional[str], _opt("--policy", help=f"Batch policy: {', '.join(POLICIES)} [default: decode-maximal]", panel=ENGINE)],
    "cache_prompt": Annotated[Optional[bool], _opt("--cache-prompt/--no-cache-prompt", help="Reuse cached prompt prefixes [default: on]", panel=ENGINE)],
    "n_gpu_layers": Annotated[Optional[int], _opt("--n-gpu-layers", help="Layers offloaded to the GPU, -1 = all [default: 0]", panel=ENGINE)],
    "chat_template": Annotated[Optional[str], _opt("--chat-template", help="Chat format NAME (llama.cpp's built-ins: chatml, llama2, mistral-v7, phi3, ...; or plain) or a Jinja FILE [default: the GGUF's own]", panel=ENGINE)],
    "deterministic": Annotated[Optional[bool], _opt("--deterministic/--no-deterministic", help="A request's tokens depend only on its prompt, sampling settings and seed, not on what else runs (CPU builds) [default: off]", panel=ENGINE)],
    "cpu_buffers": Annotated[Optional[str], _opt("--cpu-buffers", metavar="auto|plain|repack", help="CPU weight layout, and so which llama.cpp kernels run: auto = llama.cpp's default (AMX only where a probe shows it runs), plain = as in the file, repack = CPU_REPACK only [default: auto]", panel=ENGINE)],
    "kv_unified": Annotated[Optional[bool], _opt("--kv-unified/--no-kv-unified", help="One KV cache shared by every slot instead of one stream per slot: llama.cpp then splits a tick's batch into ubatches by size alone (fewer graph runs per tick), at the cost of attention over the whole cache; one request may then take up to the model's context [default: run chooses from its file's prompts and answers; on for serve (off with --deterministic); off elsewhere]", panel=ENGINE)],
    "slot_moves": Annotated[Optional[bool], _opt("--slot-moves/--no-slot-moves", help="With a KV stream per slot, move a running request into an idle slot below it so the busy slots stay consecutive (llama.cpp decodes them in one graph run) [default: on]", panel=ENGINE)],
    "max_memory": Annotated[Optional[str], _opt("--max-memory", metavar="SIZE|N%|off", help="Most memory the KV cache and weights may take, checked before the model loads: a size (16GiB, 512M), a share of the memory available (80%) or off [default: 90%]", panel=ENGINE)],
    "pooling": Annotated[Optional[str], _opt("--pooling", metavar="mean|cls|last", help="How embeddings pool token vectors into one [default: the GGUF's own pooling type, else mean]", panel=ENGINE)],
    "prefix_store": Annotated[Optional[str], _opt("--prefix-store", metavar="DIR|off", help="Folder of the disk prefix store: the KV of shared prompt prefixes and chat turns, restored by later runs instead of evaluated [default: <cache dir>/prefix-store for run, serve-stdin and chat; off for bench]", panel=ENGINE)],
    "prefix_store_max_bytes": Annotated[Optional[str], _opt("--prefix-store-max-bytes", metavar="SIZE", help="Most disk the prefix store may take; least recently used entries go first (0 = off) [default: 2GiB]", panel=ENGINE)],
    "grammar_backend": Annotated[Optional[str], _opt("--grammar-backend", metavar="auto|llguidance|llama", help="How grammars and JSON schemas constrain sampling: as token masks computed by llguidance (auto, llguidance), or by llama.cpp's GBNF sampler (llama); auto takes a GBNF grammar llguidance cannot read to llama.cpp [default: auto]", panel=ENGINE)],
    "speculative": Annotated[Optional[str], _opt("--speculative", metavar="auto|off", help="Speculative decoding from the text itself: auto drafts from a request's prediction (else by prompt lookup) and verifies the guesses in rows a tick has to spare, never changing a token; off = one token a tick [default: auto]", panel=ENGINE)],
    "cache_type_k": Annotated[Optional[str], _opt("--cache-type-k", "-ctk", metavar="TYPE", help=f"KV cache type for keys: {', '.join(CACHE_TYPES)}; q8_0 halves the cache of f16 (twice the slots or context in the same memory) [default: f16]", panel=ENGINE)],
    "cache_type_v": Annotated[Optional[str], _opt("--cache-type-v", "-ctv", metavar="TYPE", help=f"KV cache type for values: {', '.join(CACHE_TYPES)}; a quantized one needs flash attention [default: f16]", panel=ENGINE)],
    "flash_attn": Annotated[Optional[str], _opt("--flash-attn", "-fa", metavar="auto|on|off", help="Flash attention: auto = llama.cpp's choice per device (on for CPUs; off in --deterministic) [default: auto]", panel=ENGINE)],
    "max_tokens": Annotated[Optional[int], _opt("--max-tokens", help="Most tokens generated per request [default: 256]", panel=SAMPLING)],
    "temperature": Annotated[Optional[float], _opt("--temperature", help="0 = greedy [default: 0.8]", panel=SAMPLING)],
    "top_k": Annotated[Optional[int], _opt("--top-k", help="[default: 40]", panel=SAMPLING)],
    "top_p": Annotated[Optional[float], _opt("--top-p", help="[default: 0.95]", panel=SAMPLING)],
    "min_p": Annotated[Optional[float], _opt("--min-p", help="[default: 0.05]", panel=SAMPLING)],
    "repeat_penalty": Annotated[Optional[float], _opt("--repeat-penalty", help="[default: 1.0, off]", panel=SAMPLING)],
    "seed": Annotated[Optional[int], _opt("--seed", help="Sampling seed [default: random per request]", panel=SAMPLING)],
    "stop": Annotated[Optional[list[str]], _opt("--stop", help="Stop string (repeatable)", panel=SAMPLING)],
    "grammar_file": Annotated[Optional[str], _opt("--grammar-file", help="GBNF grammar file constraining output", panel=SAMPLING)],
    "json_schema": Annotated[Optional[str], _opt("--json-schema", help="JSON schema (inline JSON or a file) constraining output", panel=SAMPLING)],
    "reasoning_budget": Annotated[Optional[int], _opt("--reasoning-budget", metavar="N", help="Thinking models: the most tokens a reasoning block may take before the engine closes it and the answer follows; 0 = no reasoning (a request's reasoning_budget overrides) [default: no bound]", panel=SAMPLING)],
}

if tuple(ENGINE_OPTIONS) != SHARED_KEYS:  # a key added on one side only would be silently ignored
    raise ImportError("cli/engine_options.py declares one flag per settings.layers.SHARED_KEYS key, in that order")


@dataclass
class EngineOptions:
    """The engine and sampling options as given on the command line (None = not given)."""

    values: dict[str, Any] = field(default_factory=dict)
    command: str = ""

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)


def with_engine_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add every engine and sampling option to a Typer command; the command receives them as `opts`, and
    the Environment it runs in (the root command's context object) as `env`."""
    sig = inspect.signature(func)
    # With `from __future__ import annotations` the command's own annotations are strings, and
    # Typer does not evaluate strings found in an explicit __signature__: evaluate them here, or
    # its Annotated[..., typer.Option(...)] declarations (names, help, min=...) are lost.
    hints = typing.get_type_hints(func, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
           if p.name not in ("opts", "env")]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
             for name, ann in ENGINE_OPTIONS.items()]
    extra.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

    # The command's name, which picks its config-file table: run_command -> "run", serve_stdin -> "serve-stdin".
    command = func.__name__.removesuffix("_command").replace("_", "-")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name in ENGINE_OPTIONS}
        if given.get("stop") == []:
            given["stop"] = None  # a list option with nothing given is "not given"
        env = environment_of(kwargs.pop(_CONTEXT))
        return func(*args, opts=EngineOptions(given, command), env=env, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.config_command = command  # type: ignore[attr-defined]
    return wrapper


_CONTEXT = "_llamabatch_context"  # the click context Typer passes in; not a flag


def environment_of(ctx: typer.Context) -> Environment:
    """The Environment of the invocation `ctx` belongs to (app.root puts it on the root
    context; a command called outside main() gets a default one over the real streams)."""
    found = ctx.find_object(Environment)
    return found if found is not None else ctx.ensure_object(Environment)
