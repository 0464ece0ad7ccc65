"""The stats block `ollama run --verbose` prints after a reply, plus llamabatch's cached line.

    total duration:       1.2s
    load duration:        35ms
    prompt eval count:    6 token(s)
    prompt eval duration: 120ms
    prompt eval rate:     50.00 tokens/s
    eval count:           298 token(s)
    eval duration:        4.1s
    eval rate:            72.68 tokens/s
    cached tokens:        20 token(s)
    restored tokens:      14 token(s)

Ollama's lines come in Ollama's order, so scripts that read them keep working; the cached
line is llamabatch's own and comes after them, then (only when some were) the restored line:
of the cached tokens, those read back from the disk prefix store (chat -c) instead of evaluated.

As in Ollama, `prompt eval count` is the prompt tokens actually evaluated; `cached tokens`
are the ones the prefix cache served instead (together: the whole prompt). The first
generated token is sampled from the prompt's last logits, so it belongs to the prompt eval
time; `eval rate` is the engine's rate over the tokens after it.
"""
from __future__ import annotations

from ..results import Result

LABEL_WIDTH = 22  # "prompt eval duration: " is the longest label


def go_duration(seconds: float) -> str:
    """Like Go's time.Duration, which Ollama prints, rounded: 1.2s, 35ms, 1m2.5s, 850µs."""
    if seconds >= 60:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{_trim(rest, 3)}s"
    if seconds >= 1:
        return f"{_trim(seconds, 3)}s"
    if seconds >= 0.001:
        return f"{_trim(seconds * 1000, 3)}ms"
    if seconds > 0:
        return f"{_trim(seconds * 1e6, 3)}µs"
    return "0s"


def _trim(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return text or "0"


def stats_lines(result: Result, total_s: float, load_s: float = 0.0, restored: int | None = None) -> list[str]:
    """The block for one reply. `total_s` is the wall time from submit to result;
    `load_s` the model load this reply waited for (the first reply only; counted in the total,
    as Ollama counts it); `restored` the
    cached tokens read from the disk prefix store (default: the reply's usage says)."""
    usage, timings = result.usage, result.timings
    evaluated = usage.prompt_tokens - usage.cached_tokens
    # Ollama's total_duration spans the whole request, the load it waited for included, so
    # total >= load + prompt eval + eval. The reply's wall time starts after the load here, and
    # the engine's timers are not the wall clock's: take whichever sum is larger.
    total = load_s + max(total_s, (timings.prompt_ms + timings.decode_ms) / 1000)
    rows = [
        ("total duration", go_duration(total)),
        ("load duration", go_duration(load_s)),
        ("prompt eval count", f"{evaluated} token(s)"),
        ("prompt eval duration", go_duration(timings.prompt_ms / 1000)),
        ("prompt eval rate", f"{timings.prompt_tokens_per_s:.2f} tokens/s"),
        ("eval count", f"{usage.completion_tokens} token(s)"),
        ("eval duration", go_duration(timings.decode_ms / 1000)),
        ("eval rate", f"{timings.generated_tokens_per_s:.2f} tokens/s"),
        ("cached tokens", f"{usage.cached_tokens} token(s)"),
    ]
    restored = usage.restored_tokens if restored is None else restored
    if restored:  # of the cached ones, those read back from the disk prefix store
        rows.append(("restored tokens", f"{restored} token(s)"))
    return [f"{label + ':':<{LABEL_WIDTH}}{value}" for label, value in rows]


def parse_stats(text: str) -> list[dict[str, str]]:
    """Read stats blocks back from stderr text: one {label: value} dict per block, in order.
    A block starts at each `total duration:` line (for tests and scripts)."""
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if not sep or label.strip() != label or len(line) < LABEL_WIDTH:
            continue
        if label == "total duration":
            blocks.append({})
        if blocks and label in _LABELS:
            blocks[-1][label] = value.strip()
    return blocks


_LABELS = ("total duration", "load duration", "prompt eval count", "prompt eval duration",
           "prompt eval rate", "eval count", "eval duration", "eval rate", "cached tokens", "restored tokens")
