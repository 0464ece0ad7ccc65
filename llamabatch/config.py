"""EngineConfig: how the engine is built (model, slots, context, batch shape, policy).

EngineConfig is the one owner of the engine settings: `KEY_RULES` says what each key may
hold, `validate()` adds the rules between keys, and `from_dict` builds a config from
JSON/TOML-like data. The config file (`settings/config_file.py`) takes its engine keys and their
checks from here, as it takes the sampling ones from `SamplingParams.from_dict`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidRequest
from .checks.kv_cache_types import CACHE_TYPES, DEFAULT_CACHE_TYPE, FLASH_ATTN, is_quantized
from .checks.cpus import usable_cpus
from .checks.max_memory import byte_size_rule, max_memory_rule
from .params import SEED_ALLOWED, is_seed
from .checks.value_rules import Rule, boolean, choice, integer, optional, text

# The names these settings may hold. The code behind each name lives with the engine
# (core/scheduling/policies.py, kernel_paths/cpu_buffers.py, llama/sampling/mask_grammar.py) and takes its names from here.
POLICY_NAMES = ("decode-maximal", "prefill-priority", "balanced")
CPU_BUFFERS = ("auto", "plain", "repack")
GRAMMAR_BACKENDS = ("auto", "llguidance", "llama")

DEFAULT_CTX_PER_SLOT = 4096
SPECULATIVE_CHOICES = ("auto", "off")
SPECULATIVE_ENV = "LLAMABATCH_SPECULATIVE"
DEFAULT_PREFIX_STORE_BYTES = 2 << 30


@dataclass
class EngineConfig:
    """Settings fixed for an engine's lifetime.

    `model=None` means the bundled Gemma 3 270M; `model` may be a GGUF path, a folder, or
    a store name such as hf:ORG/REPO:QUANT or ollama:NAME:TAG (see `model_stores`).
    `model_name` is what records call the model (default: the store name as written, or
    the file name for a path).
    `n_ctx=None` ("auto") gives every slot 4096 tokens (n_ctx = 4096 * n_parallel) unless the
    work is known first: `run` sizes it from its file (settings/context_sizing.py).
    """

    model: str | None = None
    model_name: str | None = None
    n_parallel: int | str = 8  # or "auto": measured at start (see autoslots.py)
    n_ctx: int | str | None = None  # "auto" is read as None
    n_batch: int = 512
    chunk_size: int = 256
    threads: int | None = None
    policy: str = "decode-maximal"
    cache_prompt: bool = True
    n_gpu_layers: int = 0
    max_queue: int = 0
    # Of the n_parallel slots, how many only a request above the default priority (priority < 0)
    # may take: it then starts beside a full batch without putting a line of it aside. serve
    # adds its --online-slots this way, on top of --n-parallel (settings/ready.with_extra_slots).
    reserved_slots: int = 0
    chat_template: str | None = None  # a built-in NAME or a Jinja FILE; None = the GGUF's own or a fallback
    seed: int | None = None  # engine-wide default seed for requests that set none (None = random)
    # Prefix sharing across slots: a prompt sharing at least this many tokens with what another
    # slot holds or is evaluating copies them (KV fork) instead of evaluating them again. 0 = off.
    share_prefix_min: int = 32
    # One KV cache for all slots instead of one stream per slot: a tick is one graph run
    # whatever its shape, and forks share cells instead of copying them.
    kv_unified: bool = False
    # With a stream per slot, a running request moves into an idle slot below it so the busy
    # slots stay consecutive (one graph run a tick: core/scheduling/kv_ledger.py plan_moves). False: never.
    slot_moves: bool = True
    # A request's tokens depend only on its prompt, sampling parameters and seed, not on what
    # else shares the batch (see llamabatch/kernel_paths/batch_invariance.py and docs/deterministic.md). CPU builds only.
    deterministic: bool = False
    # Which CPU weight layout llama.cpp loads with, and so which kernels run (cpu_buffers.py):
    # "auto" (llama.cpp's default, AMX only where a probe shows it runs), "plain" or
    # "repack". None = $LLAMABATCH_CPU_BUFFERS, else "auto".
    cpu_buffers: str | None = None
    # The most memory the KV cache and weights may take, checked before the context is created
    # (resources.py): bytes, a size ("16GiB"), a share of the memory available ("80%") or "off".
    # None = "90%".
    max_memory: int | str | None = None
    # How embeddings pool token vectors into one: mean, cls or last. None = the GGUF's own
    # pooling type when it has one, else mean (llamabatch/llama/embedder.py).
    pooling: str | None = None
    # The disk prefix store (llamabatch/prefix_store/): a folder where KV of shared prompt
    # prefixes outlives the process, restored instead of evaluated. None = off (the CLI's default
    # is <cache dir>/prefix-store). Least recently used entries go past max_bytes (0 = off).
    prefix_store: str | None = None
    prefix_store_max_bytes: int = DEFAULT_PREFIX_STORE_BYTES
    # How grammars and JSON schemas constrain sampling (llama/sampling/mask_grammar.py): "auto" and
    # "llguidance" apply them as token masks, "llama" with llama.cpp's GBNF sampler.
    # None = $LLAMABATCH_GRAMMAR_BACKEND, else "auto".
    grammar_backend: str | None = None
    # Speculative decoding from the text itself (core/drafts.py, docs/speculative.md): "auto"
    # drafts from a request's prediction, else by prompt lookup, and verifies the guesses in
    # rows a tick has to spare; "off": one token a tick. None = $LLAMABATCH_SPECULATIVE, else "auto".
    speculative: str | None = None
    # The KV cache's element types (llama.cpp's names, kv_cache_types.py): q8_0 halves the
    # cache of f16, so twice the slots or twice the context fit in the same memory.
    cache_type_k: str = DEFAULT_CACHE_TYPE
    cache_type_v: str = DEFAULT_CACHE_TYPE
    # Flash attention: "auto" (llama.cpp's default: on where the device runs it, so on CPUs),
    # "on" or "off". A quantized V cache needs it; deterministic mode runs with it off.
    flash_attn: str = "auto"

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    @property
    def total_ctx(self) -> int:
        return self.n_ctx if self.n_ctx else DEFAULT_CTX_PER_SLOT * self.n_parallel

    @property
    def slot_ctx(self) -> int:
        """Tokens one slot may hold: llama.cpp splits the KV cache evenly between sequences."""
        return self.total_ctx // self.n_parallel

    @property
    def speculation(self) -> str:
        """"auto" or "off": the setting, else $LLAMABATCH_SPECULATIVE, else auto."""
        value = self.speculative or os.environ.get(SPECULATIVE_ENV, "").strip().lower() or "auto"
        if value not in SPECULATIVE_CHOICES:
            _bad(SPECULATIVE_ENV, "auto or off", value)
        return value

    @property
    def n_threads(self) -> int:
        return self.threads or max(1, min(usable_cpus(), 8))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: "EngineConfig | None" = None) -> "EngineConfig":
        """Build from JSON/TOML-like data, each key checked by its rule, then the rules
        between keys. `base` supplies what `data` does not set. Raises InvalidRequest."""
        values = dataclasses.asdict(base) if base is not None else {}
        for key, raw in data.items():
            if key not in KEY_RULES:
                raise InvalidRequest(f"unknown engine setting {key!r}; allowed: {', '.join(KEY_RULES)}")
            values[key] = check_key(key, raw)
        return cls(**values).validate()

    def validate(self) -> "EngineConfig":
        """Raise InvalidRequest naming the first bad setting; return self when all are fine."""
        for f in dataclasses.fields(self):
            value = check_key(f.name, getattr(self, f.name))
            if f.name in NORMALIZED_KEYS:  # "2GiB" -> bytes, "off" -> None: read as numbers/None below
                setattr(self, f.name, value)
        # the rules between keys
        slots = 1 if self.n_parallel == "auto" else self.n_parallel  # auto checks its own choice later
        if self.n_ctx is not None and self.n_ctx < 16 * slots:
            _bad("n_ctx", f"an integer >= 16 per slot ({16 * slots} for {slots} slots)", self.n_ctx)
        if self.n_batch < slots:
            _bad("n_batch", f"an integer >= n_parallel ({slots})", self.n_batch)
        if self.reserved_slots and self.n_parallel != "auto" and self.reserved_slots >= slots:
            _bad("reserved_slots", f"fewer than n_parallel ({slots}): requests at the default priority need a slot",
                 self.reserved_slots)
        if self.deterministic and self.kv_unified:
            # the invariance rests on one KV stream per sequence (llamabatch/kernel_paths/batch_invariance.py)
            _bad("kv_unified", "false when deterministic is on", self.kv_unified)
        if self.deterministic:
            # its row rule was derived for f16 attention without flash attention: a quantized K
            # takes other matmul kernels (switching at other row counts), flash attention adds
            # batch-dependent rounding (docs/deterministic.md)
            for key in ("cache_type_k", "cache_type_v"):
                if getattr(self, key) != "f16":
                    _bad(key, '"f16" when deterministic is on', getattr(self, key))
            if self.flash_attn == "on":
                _bad("flash_attn", '"auto" or "off" when deterministic is on (it runs with flash attention off)',
                     self.flash_attn)
        if is_quantized(self.cache_type_v) and self.flash_attn == "off":
            _bad("cache_type_v", 'f16 or bf16 when flash_attn is "off" (llama.cpp keeps a quantized V cache only '
                 'with flash attention)', self.cache_type_v)
        return self


def _seed(value: Any) -> Any:
    if not is_seed(value):
        raise ValueError(SEED_ALLOWED)
    return value


def _n_ctx(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return integer(16, 'an integer >= 16 (total context, split between slots) or "auto"')(value)


def _slots(value: Any) -> Any:
    if value == "auto":
        return value
    return integer(1, 'an integer >= 1 or "auto"')(value)


def _chat_template(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a built-in template name (llama.cpp's: chatml, llama2, mistral-v7, phi3, ...; or plain) "
                         "or a Jinja file")
    return value


def _prefix_store(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return None  # off
    if not isinstance(value, str) or not value.strip():
        raise ValueError('a folder, or "off"')
    return value


# What each key may hold on its own (None = "not set" where the field allows it).
KEY_RULES: dict[str, Rule] = {
    "model": optional(text("a GGUF file or folder, hf:ORG/REPO, ollama:NAME, lmstudio:PUBLISHER/REPO or a "
                           "[models] alias")),
    "model_name": optional(text("a non-empty name for records")),
    "n_parallel": _slots,
    "n_ctx": _n_ctx,
    "n_batch": integer(1, "an integer >= 1"),
    "chunk_size": integer(1, "an integer >= 1"),
    "threads": optional(integer(1, "an integer >= 1")),
    "policy": choice(*POLICY_NAMES),
    "cache_prompt": boolean,
    "n_gpu_layers": integer(-1, "an integer >= -1 (-1 = all)"),
    "max_queue": integer(0, "an integer >= 0 (0 = unbounded)"),
    "reserved_slots": integer(0, "an integer >= 0"),
    "chat_template": optional(_chat_template),
    "seed": optional(_seed),
    "share_prefix_min": integer(0, "an integer >= 0 (0 = off)"),
    "kv_unified": boolean,
    "slot_moves": boolean,
    "deterministic": boolean,
    "cpu_buffers": optional(choice(*CPU_BUFFERS)),
    "max_memory": optional(max_memory_rule),
    "pooling": optional(choice("mean", "cls", "last")),
    "prefix_store": _prefix_store,
    "prefix_store_max_bytes": byte_size_rule,
    "grammar_backend": optional(choice(*GRAMMAR_BACKENDS)),
    "speculative": optional(choice(*SPECULATIVE_CHOICES)),
    "cache_type_k": choice(*CACHE_TYPES),
    "cache_type_v": choice(*CACHE_TYPES),
    "flash_attn": choice(*FLASH_ATTN),
}
NORMALIZED_KEYS = ("prefix_store", "prefix_store_max_bytes", "n_ctx")
assert set(KEY_RULES) == {f.name for f in dataclasses.fields(EngineConfig)}, "one rule per EngineConfig field"


def check_key(key: str, value: Any) -> Any:
    """The value to use for `key`, or InvalidRequest("key must be ..., got ...")."""
    try:
        return KEY_RULES[key](value)
    except ValueError as exc:
        _bad(key, str(exc), value)


def _bad(name: str, allowed: str, got: Any) -> None:
    raise InvalidRequest(f"{name} must be {allowed}, got {got!r}")
