"""SamplingParams: per-request sampling and stopping settings, validated once at the edge."""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import InvalidRequest
from .constraints.gbnf_guard import grammar_problem
from .files.json_line import find_surrogate
from .constraints.schema_prepare import prepared_schema_text
from .constraints.tool_grammar import LarkGrammar

DEFAULT_DRY_BREAKERS = ("\n", ":", '"', "*")
# Bounds on stop strings (OpenAI allows 4 of any length; llama.cpp's server any number): enough
# for any real use, and they keep one request from costing every other one time and memory.
MAX_STOPS = 16
MAX_STOP_CHARS = 1000
MAX_BREAKERS = 64
MAX_PRIORITY = 1000  # priority is an integer in [-MAX_PRIORITY, MAX_PRIORITY]


@dataclass
class SamplingParams:
    """How one request samples and when it stops.

    Every field maps onto a llama.cpp sampler (the chain is built in C, in `llama/sampling/samplers.py`)
    or onto a stop rule handled by the engine. `temperature=0` means greedy.
    """

    max_tokens: int = 256
    min_tokens: int = 0
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] = field(default_factory=lambda: list(DEFAULT_DRY_BREAKERS))
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: str | None = None
    json_schema: dict | str | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    timeout: float | None = None
    logprobs: int | None = None
    n: int = 1  # samples of the prompt: one prefill, KV forked into n slots, seeds seed, seed+1, ...
    # Save this request's prompt KV to the engine's disk prefix store once it is evaluated
    # (Result.stored_prefix names the entry): a later process restores it instead of evaluating.
    store_prefix: bool = False
    # OpenAI's Predicted Outputs: text most of the answer is expected to repeat (an edit, a
    # rewrite). The engine drafts from it and verifies the drafts in spare rows of its ticks
    # (core/drafts.py); the answer is the one the request would get without it. A line's
    # {"type": "content", "content": ...} form is read by `from_dict` into this text.
    prediction: str | None = None
    # Draft and verify for this request (prediction, else prompt lookup) where the engine's
    # `speculative` setting is auto; False: one token a tick.
    speculative: bool = True
    # Who goes first when requests contend for slots: lower runs sooner (vLLM's convention).
    # Admission, the tick's prefill budget and preemption follow it (core/scheduling/scheduler.py).
    priority: int = 0
    # Thinking models (docs/tools.md, "Thinking models"): the most tokens a reasoning block may
    # take before the engine closes it itself (None: no bound; 0: no reasoning at all); OpenAI's
    # reasoning_effort and the chat template's own variables (chat_template_kwargs, e.g.
    # {"enable_thinking": false}), both handed to a Jinja chat template as variables.
    reasoning_budget: int | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict | None = None

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 and self.mirostat == 0

    def validate(self) -> "SamplingParams":
        """Raise InvalidRequest naming the first bad field; return self when all are fine."""
        for name in FLOAT_FIELDS:  # NaN and infinities (JSON lines may spell them) mean nothing here
            value = getattr(self, name)
            if value is not None and isinstance(value, (int, float)) and not math.isfinite(value):
                raise InvalidRequest(f"{name} must be a finite number, got {value!r}")
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "an integer >= 1", self.max_tokens)
        _check(isinstance(self.min_tokens, int) and 0 <= self.min_tokens, "min_tokens", "an integer >= 0", self.min_tokens)
        _check(self.temperature >= 0, "temperature", "a number >= 0", self.temperature)
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "an integer >= 0 (0 = off)", self.top_k)
        _check(0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(0 <= self.min_p <= 1, "min_p", "a number in [0, 1]", self.min_p)
        _check(0 < self.typical_p <= 1, "typical_p", "a number in (0, 1]", self.typical_p)
        _check(self.repeat_penalty > 0, "repeat_penalty", "a number > 0", self.repeat_penalty)
        _check(-2 <= self.presence_penalty <= 2, "presence_penalty", "a number in [-2, 2]", self.presence_penalty)
        _check(-2 <= self.frequency_penalty <= 2, "frequency_penalty", "a number in [-2, 2]", self.frequency_penalty)
        _check(isinstance(self.penalty_last_n, int) and self.penalty_last_n >= -1, "penalty_last_n", "an integer >= -1", self.penalty_last_n)
        _check(self.dry_multiplier >= 0, "dry_multiplier", "a number >= 0", self.dry_multiplier)
        _check(self.dry_base >= 1, "dry_base", "a number >= 1", self.dry_base)
        _check(0 <= self.xtc_probability <= 1, "xtc_probability", "a number in [0, 1]", self.xtc_probability)
        _check(0 <= self.xtc_threshold <= 1, "xtc_threshold", "a number in [0, 1]", self.xtc_threshold)
        _check(self.mirostat in (0, 2), "mirostat", "0 (off) or 2 (mirostat v2)", self.mirostat)
        _check(self.mirostat_tau >= 0, "mirostat_tau", "a number >= 0", self.mirostat_tau)
        _check(self.mirostat_eta >= 0, "mirostat_eta", "a number >= 0", self.mirostat_eta)
        _check(self.seed is None or is_seed(self.seed), "seed", SEED_ALLOWED, self.seed)
        _check(self.timeout is None or self.timeout > 0, "timeout", "a number of seconds > 0", self.timeout)
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20), "logprobs", "an integer in [0, 20]", self.logprobs)
        _check(isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1, "n", "an integer >= 1", self.n)
        _check(isinstance(self.store_prefix, bool), "store_prefix", "true or false", self.store_prefix)
        _check(isinstance(self.speculative, bool), "speculative", "true or false", self.speculative)
        _check(isinstance(self.priority, int) and not isinstance(self.priority, bool)
               and -MAX_PRIORITY <= self.priority <= MAX_PRIORITY, "priority",
               f"an integer in [-{MAX_PRIORITY}, {MAX_PRIORITY}] (lower runs sooner)", self.priority)
        _check(self.prediction is None or isinstance(self.prediction, str), "prediction", "text", type(self.prediction).__name__)
        check_reasoning_fields(self)
        if self.prediction is not None and self.n > 1:
            # as OpenAI: one prediction cannot guide n different samples
            raise InvalidRequest("prediction cannot be combined with n > 1")
        _check(all(isinstance(s, str) for s in self.stop), "stop", "a list of non-empty strings", self.stop)
        if "" in self.stop:
            # repr(['']) reads as noise; say what is wrong in words
            which = "stop is" if len(self.stop) == 1 else f"stop string {self.stop.index('') + 1} of {len(self.stop)} is"
            raise InvalidRequest(f"{which} an empty string; a stop string needs at least one character")
        if len(self.stop) > MAX_STOPS:
            raise InvalidRequest(f"stop has {len(self.stop)} strings; at most {MAX_STOPS} are allowed")
        _check(all(len(s) <= MAX_STOP_CHARS for s in self.stop), "stop", f"strings of at most {MAX_STOP_CHARS} characters",
               f"one of {max(map(len, self.stop), default=0)}")
        if len(self.dry_sequence_breakers) > MAX_BREAKERS:
            raise InvalidRequest(f"dry_sequence_breakers has {len(self.dry_sequence_breakers)} strings; "
                                 f"at most {MAX_BREAKERS} are allowed")
        _check(isinstance(self.dry_allowed_length, int) and self.dry_allowed_length >= 0, "dry_allowed_length",
               "an integer >= 0", self.dry_allowed_length)
        _check(isinstance(self.dry_penalty_last_n, int) and self.dry_penalty_last_n >= -1, "dry_penalty_last_n",
               "an integer >= -1", self.dry_penalty_last_n)
        # Every string goes to llama.cpp as UTF-8, which a lone surrogate ("\ud800" in JSON) can't be.
        for name in ("stop", "dry_sequence_breakers", "grammar", "json_schema", "prediction"):
            bad = find_surrogate(getattr(self, name), name)
            if bad is not None:
                raise InvalidRequest(bad)
        if self.grammar and self.json_schema is not None:
            raise InvalidRequest("give either grammar or json_schema, not both")
        if self.json_schema is not None:
            prepared_schema_text(self.json_schema)  # refused here, for every backend, before any compiles it
        if isinstance(self.grammar, LarkGrammar):
            pass  # built by constraints/tool_grammar.py from schemas the json_schema guard passed
        elif isinstance(self.grammar, str) and (problem := grammar_problem(self.grammar)) is not None:
            # llama.cpp would crash on it (constraints.gbnf_guard says how): refuse it here, whatever the backend
            raise InvalidRequest(problem)
        for tok, bias in self.logit_bias.items():
            _check(isinstance(tok, int) and tok >= 0, "logit_bias", "a map of token id -> bias", tok)
            _check(isinstance(bias, (int, float)) and not isinstance(bias, bool), "logit_bias", "a map of token id -> number", bias)
            # -inf bans the token; +inf and NaN would make every probability NaN
            _check(math.isfinite(bias) or bias == -math.inf, "logit_bias", "finite biases (or -inf to ban a token)", bias)
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: "SamplingParams | None" = None) -> "SamplingParams":
        """Build from JSON-like data (a JSONL line, a TOML table), checking types.

        Unknown keys are ignored by the caller's choice: pass only sampling keys. `base`
        supplies defaults that `data` overrides. `stop` may be a string or a list.
        """
        values = dataclasses.asdict(base) if base is not None else {}
        for key, raw in data.items():
            if key not in FIELD_TYPES:
                raise InvalidRequest(f"unknown sampling parameter {key!r}")
            values[key] = _coerce(key, raw)
        return cls(**values).validate()


# OpenAI's values of reasoning_effort (the openai SDK's ReasoningEffort).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Variables a chat template gets from the engine itself, which chat_template_kwargs may not set.
TEMPLATE_OWN_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def check_reasoning_fields(p: "SamplingParams") -> None:
    """reasoning_budget, reasoning_effort and chat_template_kwargs, each refused naming itself."""
    budget = p.reasoning_budget
    _check(budget is None or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0),
           "reasoning_budget", "an integer >= 0 (0 = no reasoning)", budget)
    _check(p.reasoning_effort is None or p.reasoning_effort in REASONING_EFFORTS, "reasoning_effort",
           f"one of {', '.join(REASONING_EFFORTS)}", p.reasoning_effort)
    kwargs = p.chat_template_kwargs
    _check(kwargs is None or (isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)),
           "chat_template_kwargs", "an object of template variables", kwargs)
    for key in kwargs or ():
        _check(key not in TEMPLATE_OWN_VARIABLES, "chat_template_kwargs",
               f"variables other than {', '.join(TEMPLATE_OWN_VARIABLES)} (the engine sets those)", key)


def template_variables(p: "SamplingParams") -> dict[str, Any]:
    """What a Jinja chat template gets beside the messages: chat_template_kwargs, reasoning_effort,
    and enable_thinking false for a reasoning_budget of 0 (unless the kwargs say otherwise)."""
    variables = dict(p.chat_template_kwargs or {})
    if p.reasoning_effort is not None:
        variables.setdefault("reasoning_effort", p.reasoning_effort)
    if p.reasoning_budget == 0:
        variables.setdefault("enable_thinking", False)
    return variables


# llama.cpp's LLAMA_DEFAULT_SEED: a sampler given it picks a seed of its own, so a result
# echoing it could not be reproduced. No seed we accept or make up is ever this value.
LLAMA_RANDOM_SEED = 0xFFFFFFFF
SEED_ALLOWED = f"an integer in [0, {LLAMA_RANDOM_SEED}) ({LLAMA_RANDOM_SEED} means 'random' to llama.cpp)"


def is_seed(value: Any) -> bool:
    """A seed that reproduces its output: 0 <= value < 0xFFFFFFFF (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < LLAMA_RANDOM_SEED


def random_seed() -> int:
    """A seed for a request that set none (never LLAMA_RANDOM_SEED, see above)."""
    return random.SystemRandom().randrange(0, LLAMA_RANDOM_SEED)


def _check(ok: bool, name: str, allowed: str, got: Any) -> None:
    if not ok:
        raise InvalidRequest(f"{name} must be {allowed}, got {got!r}")


def _number(key: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidRequest(f"{key} must be a number, got {raw!r}")
    return float(raw)


def _integer(key: str, raw: Any) -> int:
    if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, float) and raw.is_integer())):
        raise InvalidRequest(f"{key} must be an integer, got {raw!r}")
    return int(raw)


def _coerce(key: str, raw: Any) -> Any:
    kind = FIELD_TYPES[key]
    if raw is None and key in NULLABLE:
        return None
    if kind is int:
        return _integer(key, raw)
    if kind is float:
        return _number(key, raw)
    if kind is bool:
        if not isinstance(raw, bool):
            raise InvalidRequest(f"{key} must be true or false, got {raw!r}")
        return raw
    if key == "stop":
        if isinstance(raw, str):
            return [raw]
        if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
            return list(raw)
        raise InvalidRequest(f"stop must be a string or a list of strings, got {raw!r}")
    if key == "dry_sequence_breakers":
        if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
            return list(raw)
        raise InvalidRequest(f"dry_sequence_breakers must be a list of strings, got {raw!r}")
    if key == "logit_bias":
        if not isinstance(raw, dict):
            raise InvalidRequest(f"logit_bias must be an object of token id -> bias, got {raw!r}")
        out = {}
        for tok, bias in raw.items():
            try:
                tok_id = int(tok)
            except (TypeError, ValueError):
                raise InvalidRequest(f"logit_bias keys must be token ids, got {tok!r}") from None
            out[tok_id] = _number("logit_bias", bias)
        return out
    if key == "grammar":
        if not isinstance(raw, str):
            raise InvalidRequest(f"grammar must be a GBNF string, got {type(raw).__name__}")
        return raw
    if key == "prediction":
        return prediction_text(raw)
    if key == "chat_template_kwargs" and not isinstance(raw, dict):
        raise InvalidRequest(f"chat_template_kwargs must be an object of template variables, got {_kind(raw)}")
    if key in ("reasoning_effort",) and not isinstance(raw, str):
        raise InvalidRequest(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {_kind(raw)}")
    if key == "json_schema":
        if not isinstance(raw, (dict, str)):
            raise InvalidRequest(f"json_schema must be an object or a JSON string, got {type(raw).__name__}")
        return raw
    return raw


def prediction_text(raw: Any) -> str:
    """The text of a `prediction` field: OpenAI's {"type": "content", "content": TEXT or
    [{"type": "text", "text": TEXT}, ...]} (parts joined), or the text itself."""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, dict):
        raise InvalidRequest(f'prediction must be {{"type": "content", "content": ...}} or a string, got {_kind(raw)}')
    kind = raw.get("type")
    if kind != "content":
        raise InvalidRequest(f'prediction type must be "content", got {kind!r}')
    unknown = sorted(set(raw) - {"type", "content"})
    if unknown:
        raise InvalidRequest(f"prediction has an unknown field {unknown[0]!r}")
    content = raw.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise InvalidRequest(f'prediction content part {i + 1} must be {{"type": "text", "text": ...}}')
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"prediction content must be a string or a non-empty array of text parts, got {_kind(content)}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


FIELD_TYPES: dict[str, type] = {
    f.name: (int if f.type in ("int", "int | None") else float if f.type in ("float", "float | None")
             else bool if f.type == "bool" else object)
    for f in dataclasses.fields(SamplingParams)
}
FLOAT_FIELDS = tuple(name for name, kind in FIELD_TYPES.items() if kind is float)
NULLABLE = {f.name for f in dataclasses.fields(SamplingParams) if "None" in str(f.type)}
