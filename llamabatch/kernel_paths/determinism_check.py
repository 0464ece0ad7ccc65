"""Deterministic mode's self-check: before promising batch-invariant output on a machine,
see it hold once.

Deterministic mode rests on a derivation from llama.cpp's sources (batch_invariance.py:
which kernel a row takes for which ubatch size). That derivation can be wrong on a CPU or
build nobody here has run (an ARM repack layout, a new kernel in a newer llama.cpp). So at
first use on a machine the runner generates one probe request alone, then again with other
requests of other lengths in the same llama_decode calls (the padded shapes deterministic
mode makes), and compares the tokens. Different tokens: deterministic mode refuses to start
with one line naming the kernels, instead of silently not being deterministic. The verdict
is cached per machine, llama-cpp-python version, model file, kernel path and row rule
(machine_verdicts), so this costs about a second once.
"""
from __future__ import annotations

from typing import Any

from . import machine_verdicts
from ..errors import DeterminismUnavailable
from ..params import SamplingParams
from ..core.plan import Chunk, StepPlan, Trim

PROBE_TEXT = "The lighthouse keeper wrote in his log that the sea"
FILLER_TEXTS = ["One two three four five six seven eight nine ten eleven twelve",
                "Rain", "A list of colours: red, green, blue, yellow, purple, orange and"]
PROBE_TOKENS = 12
PROBE_SEED = 1234
PROBE_ROOM = 48  # cells a slot needs for the probe: its longest prompt, the tokens, padding rows


def check(runner: Any, *, cache: bool = True) -> None:
    """Raise DeterminismUnavailable unless the probe's tokens are the same alone and batched."""
    key = machine_verdicts.verdict_key("deterministic", machine_verdicts.model_identity(runner.model_path),
                                       runner.kernels.name, f"tile={runner.shapes.tile}",
                                       f"min_rows={runner.shapes.min_rows}")
    cached = machine_verdicts.read_verdict(key) if cache else None
    if cached is None and runner.slot_ctx < PROBE_ROOM:
        # the probe itself would not fit: say so, rather than refuse on a decode failure
        raise DeterminismUnavailable(
            f"--deterministic: its first-use self-check needs {PROBE_ROOM} tokens per slot; this context gives "
            f"{runner.slot_ctx} (raise --n-ctx or lower --n-parallel)")
    if cached is None:
        alone = generate(runner, with_fillers=False)
        together = generate(runner, with_fillers=True)
        ok = alone == together
        why = "same tokens alone and batched" if ok else f"tokens differ: alone {alone}, batched {together}"
        if cache:
            machine_verdicts.write_verdict(key, ok, why)
    else:
        ok, why = cached["ok"], cached.get("why", "")
    if not ok:
        raise DeterminismUnavailable(
            f"--deterministic: a probe request gave different tokens alone and batched on these kernels "
            f"({runner.kernels.name} weights: {describe_buffers(runner.weight_buffers)}; rows in tiles of "
            f"{runner.shapes.tile}, at least {runner.shapes.min_rows}: {runner.shapes.why}), so output "
            f"would depend on the batch; try --cpu-buffers plain or repack")


def describe_buffers(buffers: dict[str, float]) -> str:
    return ", ".join(f"{name} {mib:.0f} MiB" for name, mib in buffers.items()) or "buffers not logged"


def generate(runner: Any, *, with_fillers: bool, n_tokens: int = PROBE_TOKENS) -> list[int]:
    """The probe request's tokens in slot 0 (seeded sampling: a flipped rounding shows up
    sooner than under greedy), alone or with fillers in the next sequence ids, which start
    prompts of other lengths and decode beside it. Every sequence used is emptied after."""
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    probe = runner.tokenize(PROBE_TEXT, special=False)
    fillers = [runner.tokenize(t, special=False) for t in FILLER_TEXTS] if with_fillers else []
    fillers = fillers[: max(0, runner.n_seq_ids - 1)]
    samplers = [runner.build_sampler(params, PROBE_SEED + i) for i in range(1 + len(fillers))]
    seqs = list(range(1 + len(fillers)))
    try:
        prompts = [probe] + fillers
        pos = {s: len(prompts[s]) for s in seqs}
        sampled = _step(runner, [Chunk(s, s, prompts[s], 0, True, False, sampler=samplers[s]) for s in seqs])
        out = [sampled[0]]
        for _ in range(n_tokens - 1):
            sampled = _step(runner, [Chunk(s, s, [sampled[s]], pos[s], True, True, sampler=samplers[s]) for s in seqs])
            pos = {s: pos[s] + 1 for s in seqs}
            out.append(sampled[0])
        return out
    finally:
        runner.execute(StepPlan(trims=[Trim(s, 0) for s in seqs]))  # the probe leaves the slots empty
        for sampler in samplers:
            runner.free_sampler(sampler)


def _step(runner: Any, chunks: list[Chunk]) -> dict[int, int]:
    result = runner.execute(StepPlan(chunks))
    if result.status != 0:
        raise DeterminismUnavailable(f"--deterministic: the self-check's probe failed (llama_decode status {result.status})")
    return result.sampled

