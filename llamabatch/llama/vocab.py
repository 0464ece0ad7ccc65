"""A model's vocabulary: text to tokens and back, end-of-generation tokens, BOS/EOS text."""
from __future__ import annotations

import ctypes
import functools
from typing import Any

from llama_cpp import llama_cpp as C


class Vocabulary:
    """llama.cpp's llama_vocab of a loaded model (`ptr`, valid while the model is)."""

    def __init__(self, model: Any):
        self.ptr = C.llama_model_get_vocab(model)
        self.n_tokens = C.llama_vocab_n_tokens(self.ptr)
        self._piece_cache: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        # the text of BOS/EOS, for chat templates that mention them
        bos, eos = C.llama_vocab_bos(self.ptr), C.llama_vocab_eos(self.ptr)
        self.bos_text = self.token_text(bos) if bos >= 0 else ""
        self.eos_text = self.token_text(eos) if eos >= 0 else ""

    def token_text(self, token: int) -> str:
        return self.piece(token, special=True).decode("utf-8", "replace")

    def tokenize(self, text: str, *, special: bool, add_special: bool = True) -> list[int]:
        """`special`: special-token text becomes those tokens; `add_special`: the BOS (and EOS)
        the model adds to every prompt."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (C.llama_token * cap)()
        n = C.llama_tokenize(self.ptr, data, len(data), arr, cap, add_special, special)
        if n < 0:
            arr = (C.llama_token * -n)()
            n = C.llama_tokenize(self.ptr, data, len(data), arr, -n, add_special, special)
        return list(arr[:n])

    def piece(self, token: int, special: bool, buf: Any = None) -> bytes:
        """`buf`: a 256-byte buffer of the caller's own (a sampling thread must not share ours)."""
        buf = buf if buf is not None else self._piece_buf
        n = C.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.ptr, token, buf, -n, 0, special)
            return buf.raw[:n]
        return buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        # Pieces of generated text; control tokens render as nothing (special=False).
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self.piece(token, special=False)
        return piece

    @functools.cached_property
    def eog_ids(self) -> tuple[int, ...]:
        # Only chains that ban end-of-generation (ignore_eos, min_tokens) need the full list,
        # and scanning a 262,144-token vocabulary costs ~70 ms: not at every model load.
        return tuple(t for t in range(self.n_tokens) if C.llama_vocab_is_eog(self.ptr, t))

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.ptr, token))

    @functools.cached_property
    def longest_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of input one token can stand for, or None where text can
        shrink on its way to tokens (WPM and UGM normalize whitespace away).

        Under SPM and byte-level BPE every byte of the text lies in exactly one token's piece
        (special tokens at most as long as their own text; SPM's space prefix only adds), so a
        text longer than `slot tokens x this` cannot fit a slot, and is refused without being
        tokenized: llama.cpp's tokenizer is about quadratic on long runs of spaces (640k of
        them took 3.6 s). One scan of the vocabulary (~0.1 s for 262k tokens), on first need."""
        if C.llama_vocab_type(self.ptr) not in (C.LLAMA_VOCAB_TYPE_SPM, C.LLAMA_VOCAB_TYPE_BPE):
            return None
        buf = ctypes.create_string_buffer(256)
        longest = 4  # an unknown character (up to 4 bytes) may become one <unk>
        for token in range(self.n_tokens):
            n = C.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, True)
            longest = max(longest, abs(n))  # negative: the piece needs -n bytes
        return longest
