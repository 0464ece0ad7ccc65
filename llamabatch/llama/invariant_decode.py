"""Deterministic mode's decode: a tick's plan as llama_decode calls shaped by batch_invariance
(the prefill chunks, one call per padded length, then the decode rows), padding cells removed
after each, so a request's logits do not depend on what else runs."""
from __future__ import annotations

import time
from typing import Any, Iterator

from llama_cpp import llama_cpp as C

from ..kernel_paths import batch_invariance as invariance
from ..core.plan import StepPlan, StepResult


def execute_invariant(runner: Any, plan: StepPlan) -> StepResult:
    """Deterministic mode: the plan as llama_decode calls shaped by batch_invariance (the
    prefill chunks, one call per padded length, then the decode rows), padding cells
    removed after each."""
    result = StepResult()
    decodes = [c for c in plan.chunks if c.is_decode]

    def passes() -> Iterator[invariance.Pass]:
        yield from invariance.prefill_passes([c for c in plan.chunks if not c.is_decode], runner.shapes)
        if decodes:  # shaped only now: its padding rows go after what the prefill passes added
            yield invariance.decode_pass(decodes, runner.n_seq_ids, runner.kv.next_pos, runner.shapes)

    done: list[Any] = []  # chunks already evaluated: rolled back if a later pass fails
    for shaped in passes():
        status = _run_pass(runner, shaped, result)
        if status != 0:
            for chunk in done:  # llama.cpp rolls back a failed call, not an earlier one
                runner.kv.drop_from(chunk.slot, chunk.start_pos)
            result.status = status
            result.sampled.clear()
            result.logprobs.clear()
            return result
        done += shaped.chunks
    return result


def _run_pass(runner: Any, shaped: invariance.Pass, result: StepResult) -> int:
    batch = runner.batch
    for i, r in enumerate(shaped.rows):
        batch.token[i] = r.token
        batch.pos[i] = r.pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = r.seq
        batch.logits[i] = 1 if r.logits else 0
    batch.n_tokens = len(shaped.rows)
    t0 = time.perf_counter()
    status = C.llama_decode(runner.ctx, batch)
    C.llama_synchronize(runner.ctx)
    t1 = time.perf_counter()
    if status == 0:
        for chunk, row in shaped.sample_rows:
            if chunk.n_draft:
                runner.rows.verify(chunk, row, result)
            else:
                runner.rows.sample(chunk, row, result)
    for seq, pos in shaped.trims:  # the padding rows' cells (none are left after a failure)
        runner.kv.drop_from(seq, pos)
    result.eval_ms += (t1 - t0) * 1000
    result.sample_ms += (time.perf_counter() - t1) * 1000
    result.ubatches += 1  # a pass is shaped to fit one ubatch (batch_invariance)
    return status
