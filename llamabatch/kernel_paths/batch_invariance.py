"""Deterministic mode's batch shapes: every row of every forward pass takes the same kernel path.

Why (measured on this project's CPU build; see docs/deterministic.md): a row's
result in llama.cpp's CPU matmuls does not depend on the other rows, but WHICH kernel runs
depends on how many rows the ubatch has, and the kernels round differently:
  - repacked Q4_K weights: a 4-row `gemm` for rows - rows % 4, a 1-row `gemv` for the rest
    (ggml-cpu repack.cpp, forward_mul_mat_one_chunk);
  - Q5_0 / Q8_0 weights: llamafile's tinyBLAS for >= 2 rows, ggml's vec_dot for 1
    (llamafile_sgemm: "only enable sgemm for prompt processing");
  - K-quant weights that are not repacked (Q6_K on x86; Q4_K too where repacking is off, as
    on a machine whose AMX traps): the "tiled" kernel for >= 8 rows, vec_dot below (ggml-cpu
    tiled.cpp, ggml_tiled_min_batch).
So every ubatch gets a multiple of `tile` rows and at least `min_rows`, and so do the rows
that ask for logits (llama.cpp runs the last layer's FFN on those rows only). `derive_shapes`
chooses the two from the kernels the loaded weights really use (the repack rule, the tensor
types, the CPU); the runner's self-check (determinism_check.py) is the guard where the
derivation is wrong.

Attention is already row-invariant with flash attention off and one KV stream per sequence,
as long as every token meets the same path: >= 2 query rows in its stream, where llamafile's
tinyBLAS takes the attention products (one row would take ggml's vec_dot, which rounds
differently). A prompt token is evaluated with the other tokens of its chunk, and a
generated token with the rows after it in its stream: guesses being verified (speculative
decoding) or padding, so the same token gives the same logits whether guesses ride with it
or not. Hence:
  - prefill and decode never share a llama_decode call;
  - a prefill chunk is padded INSIDE its own sequence with dummy tokens after its end (causal
    attention: the real rows never see them), trimmed right after; a chunk that ends the
    prompt asks logits for its last MIN_ROWS rows;
  - chunks of different padded lengths never share a llama_decode call. llama.cpp's
    split_equal cuts a ubatch from a run of consecutive sequence ids, taking the SAME number
    of tokens from each: a 12-row chunk next to an 8-row one would run as 8 rows in one
    ubatch and its last 4 rows alone in another, below MIN_ROWS (traced: that flipped a
    seeded answer at 3 slots). With one length per call every chunk runs whole, in a ubatch
    of >= MIN_ROWS rows;
  - a decode pass is ONE ubatch: the ids from the lowest to the highest decoding slot, gaps
    filled and the run extended to a multiple of TILE (>= MIN_ROWS) with idle slots or spare
    sequence ids; every id takes the same number of rows, the longest decode chunk's (a
    token and its guesses) and at least 2, padded inside its own stream after its real rows,
    all asking logits, padding removed right after. (split_equal takes the same number of
    tokens from each sequence of a ubatch: equal rows keep the pass one ubatch.)
Pure functions: the runner turns a Pass into llama_batch rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..core.plan import Chunk

TILE = 4  # rows per gemm tile of the repacked kernels (the default Shapes)
MIN_ROWS = 8  # fewest rows in any ubatch: at or above the tiled K-quant kernel's threshold
DECODE_ROWS = 2  # fewest rows a sequence takes in a decode pass: attention takes tinyBLAS from 2
PAD_TOKEN = 0  # what a padding row holds; its value never reaches a real row


@dataclass(frozen=True)
class Shapes:
    """Deterministic mode's row rule: every ubatch a multiple of `tile` rows, >= `min_rows`."""

    tile: int = TILE
    min_rows: int = MIN_ROWS
    why: str = "defaults"


DEFAULT = Shapes()
# K-quant and IQ types ggml-cpu's tiled matmul takes (x86 builds with AVX/AVX2/AVX-512 only;
# ggml/src/ggml-cpu/tiled/tiled.cpp): Q2_K..Q6_K, IQ4_XS, IQ2_*, IQ3_*, IQ1_*.
TILED_TYPES = {10, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 29}
TILED_MIN_BATCH = 8  # ggml_tiled_min_batch: the tiled kernel runs at >= 8 rows, vec_dot below
REPACK_GEMM_TILE = 4  # repack.cpp forward_mul_mat_one_chunk: gemm on rows - rows % 4, gemv after


def derive_shapes(weight_types: list[tuple[int, bool]], x86: bool) -> Shapes:
    """The row rule for the matmul weights a model really uses: (ggml type, repacked) each.

    - Repacked weights (CPU_REPACK, x86 and ARM alike): 4-row gemm tiles, gemv for the rest
      -> every run of rows a multiple of 4, at least 4.
    - Weights left plain: on ARM with int8 matmul (i8mm) ggml's vec_dot takes 2 rows at a
      time, so rows pair up; a multiple of 4 covers that too. On x86 a K-quant/IQ type that is
      not repacked takes the tiled kernel at >= 8 rows and vec_dot below -> at least 8.
      llamafile's tinyBLAS (Q8_0, Q4_0, Q5_0, F16, ... at >= 2 rows) is below both.
    """
    reasons = []
    min_rows = REPACK_GEMM_TILE
    if any(repacked for _, repacked in weight_types):
        reasons.append(f"CPU_REPACK gemm in {REPACK_GEMM_TILE}-row tiles")
    plain_tiled = sorted({t for t, repacked in weight_types if not repacked and t in TILED_TYPES})
    if x86 and plain_tiled:
        min_rows = TILED_MIN_BATCH
        reasons.append(f"tiled K-quant matmul from {TILED_MIN_BATCH} rows (ggml types {', '.join(map(str, plain_tiled))})")
    if any(not repacked for _, repacked in weight_types):
        reasons.append("plain weights: vec_dot / tinyBLAS")
    return Shapes(REPACK_GEMM_TILE, min_rows, "; ".join(reasons) or "no quantized matmul weights")


@dataclass
class Row:
    seq: int
    token: int
    pos: int
    logits: bool


@dataclass
class Pass:
    """One llama_decode call: the chunks it evaluates, its rows, which row each chunk samples from, and the padding
    cells to remove afterwards ((seq, first position to drop))."""

    chunks: list[Chunk] = field(default_factory=list)  # the plan's chunks this call evaluates
    rows: list[Row] = field(default_factory=list)
    sample_rows: list[tuple[Chunk, int]] = field(default_factory=list)
    trims: list[tuple[int, int]] = field(default_factory=list)


def padded_len(n: int, shapes: Shapes = DEFAULT) -> int:
    """Rows a prefill chunk of n tokens takes: a multiple of the tile, at least min_rows."""
    return max(shapes.min_rows, n + (-n) % shapes.tile)


def n_sequence_ids(n_slots: int, shapes: Shapes = DEFAULT) -> int:
    """Sequence ids the context needs: the slots plus spares, so that a decode pass can always
    be extended to a multiple of the tile, at least min_rows."""
    return max(shapes.min_rows, n_slots + (-n_slots) % shapes.tile)


def extra_cells(shapes: Shapes = DEFAULT) -> int:
    """Cells a slot must keep free beyond its tokens for the padding rows after a chunk."""
    return max(shapes.min_rows, shapes.tile) - 1


def prefill_passes(chunks: list[Chunk], shapes: Shapes = DEFAULT) -> list[Pass]:
    """The prefill chunks as llama_decode calls: one per padded length, slots ascending (so
    consecutive slots of that length share a ubatch, each with all its rows)."""
    groups: dict[int, list[Chunk]] = {}
    for chunk in chunks:
        groups.setdefault(padded_len(len(chunk.tokens), shapes), []).append(chunk)
    return [prefill_pass(sorted(group, key=lambda c: c.slot), shapes) for _, group in sorted(groups.items())]


def prefill_pass(chunks: list[Chunk], shapes: Shapes = DEFAULT) -> Pass:
    """One llama_decode call's rows for prefill chunks (of one padded length: prefill_passes)."""
    out = Pass(chunks=list(chunks))
    for chunk in chunks:
        n = len(chunk.tokens)
        size = padded_len(n, shapes)
        first_logit_row = size - shapes.min_rows if chunk.wants_logits else size
        base = len(out.rows)
        for j in range(size):
            token = chunk.tokens[j] if j < n else PAD_TOKEN
            out.rows.append(Row(chunk.slot, token, chunk.start_pos + j, j >= first_logit_row))
        if chunk.wants_logits:
            out.sample_rows.append((chunk, base + n - 1))
        if size > n:
            out.trims.append((chunk.slot, chunk.start_pos + n))
    return out


def max_decode_rows(shapes: Shapes = DEFAULT) -> int:
    """Rows one sequence may take in a decode pass (a token and its guesses): what the cells
    kept free past a slot's tokens (extra_cells) and the ubatch's padding room allow."""
    return extra_cells(shapes) + 1


def decode_pass(chunks: list[Chunk], n_ids: int, next_pos: Callable[[int], int], shapes: Shapes = DEFAULT) -> Pass:
    """`next_pos(seq)`: the position after the last token a sequence holds (0 when empty).
    A chunk is a generated token and the guesses verified with it (Chunk.n_draft)."""
    out = Pass(chunks=list(chunks))
    if not chunks:
        return out
    by_slot = {c.slot: c for c in chunks}
    per_id = max(DECODE_ROWS, *(len(c.tokens) for c in chunks))
    if per_id > max_decode_rows(shapes):
        raise ValueError(f"a decode chunk of {per_id} rows is over the {max_decode_rows(shapes)} a pass pads")
    ids = list(range(min(by_slot), max(by_slot) + 1))
    while len(ids) % shapes.tile or len(ids) < shapes.min_rows:
        if ids[-1] + 1 < n_ids:
            ids.append(ids[-1] + 1)
        elif ids[0] > 0:
            ids.insert(0, ids[0] - 1)
        else:
            raise ValueError(f"{n_ids} sequence ids cannot hold a decode pass of {len(ids) + 1}+ rows")
    for seq in ids:
        chunk = by_slot.get(seq)
        real = chunk.tokens if chunk is not None else []
        pos = chunk.start_pos if chunk is not None else next_pos(seq)
        for j in range(per_id):
            out.rows.append(Row(seq, real[j] if j < len(real) else PAD_TOKEN, pos + j, True))
        if chunk is not None and chunk.wants_logits:  # one that does not: tokens the engine wrote, cut at the cap
            out.sample_rows.append((chunk, len(out.rows) - per_id + len(real) - 1))
        out.trims.append((seq, pos + len(real)))
    return out
